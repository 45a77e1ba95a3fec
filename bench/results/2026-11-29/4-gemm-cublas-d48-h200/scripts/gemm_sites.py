"""Every GEMM call site of a d48 micro-step (B=16, T=1024: 16,384 rows, C=1600) at the shapes and strides the
model uses: what runs now (quack at its pinned tile, the GELU-epilogue pair, cuBLAS's fp32-out weight gradients,
the scaled-exp classifier) against the best cuBLAS equivalent with the separate op it would need (GELU, its
derivative: Inductor's fused pointwise kernel; the classifier's softmax: the Triton path). triton's do_bench,
median µs, L2 flushed between calls. Run from the repository root with the `gpu` extra installed.

    python bench/results/2026-11-29/4-gemm-cublas-d48-h200/scripts/gemm_sites.py --json out.json
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import kernels.cross_entropy as ce
import kernels.linear as lin
import kernels.mlp as mlp

p = argparse.ArgumentParser()
p.add_argument("--json")
p.add_argument("--rows", type=int, default=16384)
p.add_argument("--width", type=int, default=1600)
p.add_argument("--vocab", type=int, default=50304)
args = p.parse_args()
N, C, dt = args.rows, args.width, torch.bfloat16
print("configure_linear:", lin.configure_linear(n_embd=C), "configure_mlp:", mlp.configure_mlp(n_embd=C),
      "configure_classifier:", ce.configure_classifier(n_embd=C), flush=True)
g = torch.Generator(device="cuda").manual_seed(0)


def randn(*shape, scale=1.0):
    return (scale * torch.randn(*shape, device="cuda", generator=g)).to(dt)


def us(fn):
    fn()
    torch.cuda.synchronize()
    return 1e3 * do_bench(fn, warmup=25, rep=150, return_mode="median")


h = lin.empty_with_ones_column(N, C, dt, torch.device("cuda"))  # add_layernorm's output: rows padded_width(C) apart
h.copy_(randn(N, C))
y_att = randn(N, C)  # attention's output, c_proj's input
dy, dqkv = randn(N, C), randn(N, 3 * C)
pre, dpre = randn(N, 4 * C), randn(N, 4 * C, scale=0.1)
post = F.gelu(pre, approximate="tanh")
w_attn, w_aproj, w_fc, w_mproj = (randn(*s, scale=0.02) for s in ((3 * C, C), (C, C), (4 * C, C), (C, 4 * C)))
b = randn(4 * C, scale=0.02)
rows = []


def row(site, shape, ours_name, ours, alts):
    r = dict(site=site, shape=shape, ours=ours_name, ours_us=round(us(ours), 1))
    for name, fn in alts:
        try:
            r[name] = round(us(fn), 1)
        except Exception as e:  # noqa: BLE001
            r[name] = f"{type(e).__name__}: {str(e)[:120]}"
    rows.append(r)
    print(json.dumps(r), flush=True)


t0 = time.time()
# plain GEMMs through kernels.linear.matmul (forward and input gradient)
for site, table, a, w, bias in (("c_attn fwd", lin.C_ATTN_FORWARD, h, w_attn.t(), b[:3 * C]),
                                ("c_attn dX", lin.C_ATTN_INPUT_GRAD, dqkv, w_attn, None),
                                ("attn c_proj fwd", lin.ATTN_PROJ, y_att, w_aproj.t(), b[:C]),
                                ("attn c_proj dX", lin.ATTN_PROJ, dy, w_aproj, None),
                                ("MLP c_proj fwd", lin.MLP_PROJ_FORWARD, post, w_mproj.t(), b[:C]),
                                ("MLP c_fc dX", lin.MLP_FC_INPUT_GRAD, dpre, w_fc, None)):
    tile = lin.tile_for(table, C)
    row(site, f"{tuple(a.shape)} stride {a.stride()} @ {tuple(w.shape)}" + (" + bias" if bias is not None else ""),
        f"quack {tile}", lambda a=a, w=w, bias=bias, tile=tile: lin.matmul(a, w, bias, tile),
        [("cublas_us", lambda a=a, w=w, bias=bias: torch.addmm(bias, a, w) if bias is not None else a @ w)])

# weight gradients (cuBLAS now, fp32 out): the same product through quack's GEMM at a few tiles, for scale
quack_gemm = lin._load_quack_gemm()
wg_tiles = [lin._tile(128, 160, True, 1, 2), lin._tile(256, 160, False, 1, 2), lin._tile(128, 192, True, 1, 2),
            lin._tile(256, 128, False, 2, 1), lin._tile(128, 256, False, 1, 2)]
for site, a, bm in (("c_attn dW+db", dqkv.t(), lin.augmented(h)), ("attn c_proj dW", dy.t(), y_att),
                    ("MLP c_fc dW+db", dpre.t(), lin.augmented(h)), ("MLP c_proj dW", dy.t(), post)):
    out = torch.empty(a.size(0), bm.size(1), device="cuda", dtype=torch.float32)
    alts = [(f"quack {t['tile_m']}x{t['tile_n']}{'pp' if t['pingpong'] else 'co'} {t['cluster_m']}x{t['cluster_n']}",
             lambda a=a, bm=bm, out=out, t=t: quack_gemm(a, bm, out, None, t)) for t in wg_tiles]
    row(site, f"{tuple(a.shape)} stride {a.stride()} @ {tuple(bm.shape)} stride {bm.stride()} -> fp32",
        "cuBLAS mm(out_dtype=fp32)", lambda a=a, bm=bm: lin.matmul_out(a, bm, torch.float32), alts)
    if time.time() - t0 > 200:
        break

# the GELU-epilogue pair (kernels/mlp.py) against cuBLAS + Inductor's pointwise GELU / GELU-backward
q = mlp._load_quack()
gelu_c = torch.compile(lambda x: F.gelu(x, approximate="tanh"))


def _dgelu(dpost, x):
    x32 = x.float()
    t = torch.tanh(0.7978845608028654 * (x32 + 0.044715 * x32 ** 3))
    d = 0.5 * (1 + t) + 0.5 * x32 * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x32 * x32)
    return (dpost.float() * d).to(x.dtype), (0.5 * x32 * (1 + t)).to(x.dtype)


dgelu_c = torch.compile(_dgelu)
dgelu_nopost_c = torch.compile(lambda dpost, x: _dgelu(dpost, x)[0])
wfc_t, bfc = w_fc.t(), b
row("MLP c_fc fwd + GELU", f"{tuple(h.shape)} stride {h.stride()} @ {tuple(wfc_t.shape)} + bias, GELU, pre+post",
    "quack gemm_act (default config)",
    lambda: q.gemm_act(h, wfc_t, bias=bfc, activation=mlp.GELU, store_preact=True, tuned=False),
    [("cublas_us", lambda: torch.addmm(bfc, h, wfc_t)),
     ("cublas+gelu_us", lambda: gelu_c(torch.addmm(bfc, h, wfc_t))),
     ("cublasLt_gelu_epilogue_no_pre_us", lambda: torch._addmm_activation(bfc, h, wfc_t, use_gelu=True))])
row("MLP c_proj dX + dGELU (post rebuilt)", f"{tuple(dy.shape)} @ {tuple(w_mproj.shape)}, dgelu(pre), post",
    "quack dgelu_mod (128x192 pp 1x2)",
    lambda: q.dgelu(dy, w_mproj, pre, out={"D": torch.empty_like(pre), "postact": torch.empty_like(pre)},
                    config=q.dgelu_config, dynamic_scheduler=True),
    [("cublas_us", lambda: dy @ w_mproj), ("cublas+dgelu_us", lambda: dgelu_c(dy @ w_mproj, pre))])
row("MLP c_proj dX + dGELU (post kept)", f"{tuple(dy.shape)} @ {tuple(w_mproj.shape)}, dgelu(pre)",
    "quack dgelu_no_post (192x128 pp 1x2)",
    lambda: q.dgelu_no_post(dy, w_mproj, pre, out={"D": torch.empty_like(pre)}, config=q.dgelu_no_post_config,
                            dynamic_scheduler=True),
    [("cublas+dgelu_us", lambda: dgelu_nopost_c(dy @ w_mproj, pre))])

# lm_head: one 16,384-row chunk, forward + backward (logits, dx, dW), scaled-exp (quack) against the Triton path
# (cuBLAS's three GEMMs + the softmax pass), and cuBLAS's three GEMMs alone
x = randn(N, C)
wte = randn(args.vocab, C, scale=0.02)
tg = torch.randint(0, 50257, (N,), device="cuda", generator=g)


def lce(on):
    ce._scaled_exp_on_cuda = on
    return lambda: ce._linear_cross_entropy_op(x, wte, tg, 50257, -1, dt, N, True)


lg = torch.empty(N, args.vocab, device="cuda", dtype=dt)
dW = torch.zeros(args.vocab, C, device="cuda", dtype=torch.float32)
on = ce._scaled_exp_on_cuda
r = dict(site="lm_head fwd+bwd (one chunk)", shape=f"({N}, {C}) @ ({C}, {args.vocab}), dx, dW fp32")
for name, fn in (("scaled_exp_quack_us", lce(True)), ("triton_softmax_cublas_us", lce(False)),
                 ("cublas_logits_us", lambda: torch.mm(x, wte.t(), out=lg)), ("cublas_dx_us", lambda: lg @ wte),
                 ("cublas_dW_us", lambda: dW.addmm_(lg.t(), x))):
    try:
        r[name] = round(us(fn), 1)
    except Exception as e:  # noqa: BLE001
        r[name] = f"{type(e).__name__}: {str(e)[:160]}"
ce._scaled_exp_on_cuda = on
rows.append(r)
print(json.dumps(r), flush=True)
if args.json:
    json.dump(dict(rows=rows, torch=torch.__version__, gpu=torch.cuda.get_device_name()), open(args.json, "w"),
              indent=1)
