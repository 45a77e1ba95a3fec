"""FA4's SM90 backward at d12's attention shape (B=64, T=1024, 12 heads of 64, causal): tile configs, deterministic."""
import dataclasses
import time

import torch
from triton.testing import do_bench

import flash_attn.cute.interface as fi

torch.manual_seed(0)
B, T, H, D = 64, 1024, 12, 64
qkv = torch.randn(B, T, 3, H, D, device="cuda", dtype=torch.bfloat16)
q, k, v = qkv.unbind(2)
from kernels.attention import _attention_fwd  # noqa: E402  cuDNN's forward as the model runs it

y, lse = _attention_fwd(qkv.view(B, T, 3 * H * D), H)
y = y.view(B, T, H, D)
dy = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
default = fi._tile_size_bwd_sm90(D, D, True, False)
print(default, flush=True)
variants = {
    "default": {},
    "m64 n128 MdQ1 dQ_single_wg": dict(m_block_size=64, AtomLayoutMdQ=1, dQ_single_wg=True),
    "m64 n128 MdQ1": dict(m_block_size=64, AtomLayoutMdQ=1),
    "m64 n128": dict(m_block_size=64),
    "PdS1": dict(num_stages_PdS=1),
    "SdP_swapAB False, MSdP 2": dict(SdP_swapAB=False, AtomLayoutMSdP=2),
    "dQ_swapAB": dict(dQ_swapAB=True),
    "m128 n64 NdKV1": dict(n_block_size=64, AtomLayoutNdKV=1),
}
orig = fi._tile_size_bwd_sm90
ref = None
for name, change in variants.items():
    for det in ((True, False) if name == "default" else (True,)):
        cfg = dataclasses.replace(default, **change)
        fi._tile_size_bwd_sm90 = lambda *a, cfg=cfg, **kw: cfg
        dq, dk, dv = (torch.empty_like(q) for _ in range(3))
        try:
            t0 = time.time()
            fi._flash_attn_bwd(q, k, v, y, dy, lse, causal=True, deterministic=det, dq=dq, dk=dk, dv=dv)
            torch.cuda.synchronize()
            compile_s = time.time() - t0
            first = [t.clone() for t in (dq, dk, dv)]
            ms = do_bench(lambda: fi._flash_attn_bwd(q, k, v, y, dy, lse, causal=True, deterministic=det,
                                                     dq=dq, dk=dk, dv=dv), warmup=10, rep=100)
            same = all(torch.equal(a, b) for a, b in zip(first, (dq, dk, dv)))
            if ref is None:
                ref = first
            err = max(float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(first, ref))
            print(f"{name:32s} det={det!s:5s} {ms * 1e3:7.1f} us  repeat-equal={same}  rel-err vs default {err:.1e}"
                  f"  (compile {compile_s:.0f} s)", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:32s} det={det}: {type(e).__name__}: {str(e)[:200]}", flush=True)
fi._tile_size_bwd_sm90 = orig
