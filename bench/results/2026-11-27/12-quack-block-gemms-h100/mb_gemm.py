"""The block GEMMs of a d12 micro-step (65,536 rows): cuBLAS as the step calls it against quack's GEMM at pinned
configs, per call, with the step's calls a step (8 micro-steps x 12 layers) to weigh each."""
import itertools
import sys
import time

import torch
from triton.testing import do_bench

from quack.gemm_config import GemmConfig
from quack.gemm_interface import gemm_tuned

torch.manual_seed(0)
dev = torch.device("cuda")
bf, f32 = torch.bfloat16, torch.float32
N, C, H = 65536, 768, 3072
CW = 832  # the ones-column layout's row stride (padded_width(768))
print(torch.cuda.get_device_name(), torch.__version__, time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))


def r(*s, dtype=bf):
    return torch.randn(*s, device=dev, dtype=dtype) * 0.1


h_store = r(N, CW); h_store[:, C:C + 8] = 0; h_store[:, C] = 1
h = h_store[:, :C]
h_aug = h_store[:, :C + 8]
dqkv, y, dy, post, dpre = r(N, 3 * C), r(N, C), r(N, C), r(N, H), r(N, H)
w_attn, w_cproj, w_fc, w_mproj, b_attn = r(3 * C, C), r(C, C), r(H, C), r(C, H), r(3 * C)

# (name, A (M, K), B (K, N), out dtype, bias, torch call): what the step runs today
cases = [
    ("F1 c_attn fwd +bias", h, w_attn.t(), bf, b_attn, lambda: torch.addmm(b_attn, h, w_attn.t())),
    ("F2 attn c_proj fwd", y, w_cproj.t(), bf, None, lambda: y @ w_cproj.t()),
    ("F3 mlp c_proj fwd", post, w_mproj.t(), bf, None, lambda: post @ w_mproj.t()),
    ("D1 c_attn dX", dqkv, w_attn, bf, None, lambda: dqkv @ w_attn),
    ("D2 attn c_proj dX", dy, w_cproj, bf, None, lambda: dy @ w_cproj),
    ("D3 mlp c_fc dX", dpre, w_fc, bf, None, lambda: dpre @ w_fc),
    ("W1 c_attn dW+db", dqkv.t(), h_aug, f32, None, lambda: torch.mm(dqkv.t(), h_aug, out_dtype=f32)),
    ("W2 attn c_proj dW (bf16)", dy.t(), y, bf, None, lambda: dy.t() @ y),
    ("W3 mlp c_fc dW+db", dpre.t(), h_aug, f32, None, lambda: torch.mm(dpre.t(), h_aug, out_dtype=f32)),
    ("W4 mlp c_proj dW", dy.t(), post, f32, None, lambda: torch.mm(dy.t(), post, out_dtype=f32)),
]
configs = [GemmConfig(tile_m=m, tile_n=n, pingpong=pp, cluster_m=cm, cluster_n=cn, is_dynamic_persistent=False,
                      device_capacity=9)
           for (m, n, pp), (cm, cn) in itertools.product(
               [(128, 192, True), (128, 256, False), (256, 128, False), (128, 128, True), (192, 128, True),
                (256, 192, False)],
               [(2, 1), (1, 2)])]
deadline = time.time() + float(sys.argv[1] if len(sys.argv) > 1 else 420)
for name, A, B, odt, bias, ref_fn in cases:
    ref = ref_fn().float()
    t_ref = do_bench(ref_fn, warmup=20, rep=150)
    flops = 2 * A.size(0) * A.size(1) * B.size(1)
    print(f"\n{name}: ({A.size(0)} x {A.size(1)}) @ ({B.size(0)} x {B.size(1)})  cuBLAS {t_ref * 1e3:7.1f} us "
          f"{flops / t_ref / 1e9:5.0f} TFLOP/s", flush=True)
    best = None
    for cfg in configs:
        for split in ((1, 2) if odt == f32 and name.startswith("W") else (1,)):
            if time.time() > deadline:
                break
            out = torch.empty(A.size(0), B.size(1), device=dev, dtype=odt)
            label = f"  quack {cfg.tile_m}x{cfg.tile_n} {'pp' if cfg.pingpong else 'co'} c{cfg.cluster_m}x{cfg.cluster_n} s{split}"
            try:
                fn = lambda: gemm_tuned.fn(A, B, out, bias=bias, config=cfg, split_k=split)
                fn(); torch.cuda.synchronize()
                err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                t = do_bench(fn, warmup=20, rep=150)
            except Exception as e:  # noqa: BLE001 - a config that does not launch is reported and skipped
                print(f"{label}: {type(e).__name__}: {str(e)[:100]}", flush=True)
                continue
            print(f"{label}: {t * 1e3:7.1f} us  {flops / t / 1e9:5.0f} TFLOP/s  x{t_ref / t:.3f}  err {err:.1e}",
                  flush=True)
            if best is None or t < best[0]:
                best = (t, label)
    if best:
        print(f"  best {best[1].strip()}: {best[0] * 1e3:.1f} us against cuBLAS {t_ref * 1e3:.1f} "
              f"(x 96 a step: {(t_ref - best[0]) * 96:+.2f} ms)", flush=True)
