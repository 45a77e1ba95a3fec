"""Per-kernel timings at the training shapes: each fused op vs its torch.compile equivalent.

Every row is one forward + backward (or one optimizer step) timed with CUDA events
(`triton.testing.do_bench`, median), and the extra GPU memory it needed over its inputs. The floor
column is the physical lower bound: FLOPs at the measured bf16 matmul rate, or bytes at the measured
copy bandwidth, whichever is larger (that term says whether the op is bound by arithmetic or by memory).

    python -m bench.bench_kernels --help
"""

from __future__ import annotations

import argparse
import json
import traceback
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from gpt2.config import GPTConfig
from gpt2_kernels import cross_entropy
from gpt2_kernels.attention import BACKENDS
from gpt2_kernels.cross_entropy import linear_cross_entropy
from gpt2_kernels.layernorm import add_layernorm
from gpt2_kernels.linear import with_ones_column


@dataclass
class KernelTiming:
    op: str
    impl: str
    ms: float
    extra_mem_gb: float
    floor_ms: float | None = None


@dataclass
class Ceilings:
    matmul_tflops: float  # bf16 8192^3 product
    copy_tbps: float  # device-to-device copy, bytes read + written


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(median ms, peak extra GB) of fn() on CUDA; memory measured on one warm call."""
    from triton.testing import do_bench

    fn()  # compile / autotune / allocate outside the measurement
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    extra = (torch.cuda.max_memory_allocated() - base) / 1e9
    ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
    return ms, extra


def measure_ceilings() -> Ceilings:
    from triton.testing import do_bench

    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")
    tflops = 2 * 8192**3 / (ms * 1e-3) / 1e12
    src = torch.randn(2**30 // 4, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    tbps = 2 * src.numel() * 4 / (ms * 1e-3) / 1e12
    return Ceilings(tflops, tbps)


def _floor_ms(flops: float, bytes_moved: float, ceil: Ceilings) -> float:
    return max(flops / (ceil.matmul_tflops * 1e12), bytes_moved / (ceil.copy_tbps * 1e12)) * 1e3


def bench_classifier(cfg: GPTConfig, N: int, ceil: Ceilings, chunk_rows: tuple[int, ...]) -> list[KernelTiming]:
    """lm_head + cross-entropy forward and backward on N rows, bf16 matmuls, fp32 weight (tied wte)."""
    C, V, Vp = cfg.n_embd, cfg.vocab_size, cfg.padded_vocab_size
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(N, C, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    w = (0.02 * torch.randn(Vp, C, device="cuda", generator=g)).requires_grad_()
    targets = torch.randint(0, V, (N,), device="cuda", generator=g)

    @torch.compile
    def plain(x, w, targets):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = F.linear(x, w)[:, :V]  # (N, V), as gpt2.model's plain path
            return F.cross_entropy(logits, targets, ignore_index=-1)

    def fwd_bwd(loss_fn):
        def run():
            x.grad = w.grad = None
            loss_fn().backward()
        return run

    floor = _floor_ms(6 * N * C * Vp, 0, ceil)
    rows = [KernelTiming("classifier fwd+bwd", "torch.compile", *timed(fwd_bwd(lambda: plain(x, w, targets))), floor)]
    try:
        for scaled_exp in (False, True):  # the Triton softmax pass, then quack's scaled-exp GEMMs where they run
            path = cross_entropy.configure_classifier(torch.bfloat16, "cuda", scaled_exp, n_embd=C)
            if scaled_exp and path != "quack-scaled-exp":
                continue
            for n in chunk_rows:
                loss_fn = lambda n=n: linear_cross_entropy(x, w, targets, V, compute_dtype=torch.bfloat16, chunk_rows=n)
                rows.append(KernelTiming("classifier fwd+bwd", f"fused {path}, chunk {n}", *timed(fwd_bwd(loss_fn)), floor))
    finally:
        cross_entropy._scaled_exp_on_cuda = False
    return rows + bench_cross_entropy_rows(cfg, min(N, chunk_rows[0]), ceil)


def bench_cross_entropy_rows(cfg: GPTConfig, n: int, ceil: Ceilings) -> list[KernelTiming]:
    """The classifier's softmax pass alone on one (n, Vp) bf16 chunk, per launch shape (columns per
    block, warps); the first is the one gpt2_kernels/cross_entropy.py uses. It overwrites the logits with
    dlogits, so later repetitions see other values: the timing does not depend on them."""
    from gpt2_kernels.cross_entropy import ROWS_BLOCK, ROWS_WARPS, _cross_entropy_rows_kernel

    V, Vp = cfg.vocab_size, cfg.padded_vocab_size
    g = torch.Generator(device="cuda").manual_seed(4)
    logits = torch.randn(n, Vp, device="cuda", dtype=torch.bfloat16, generator=g)
    targets = torch.randint(0, V, (n,), device="cuda", generator=g)
    losses = torch.empty(n, device="cuda")
    grad_scale = torch.full((1,), 1.0 / n, device="cuda")
    floor = _floor_ms(0, 3 * n * Vp * 2, ceil)  # read the bf16 logits twice, write dlogits once
    rows = []
    shapes = ((ROWS_BLOCK, ROWS_WARPS), (4096, 8), (2048, 8), (2048, 16), (1024, 8), (8192, 16), (4096, 16))
    for block, warps in shapes:
        def run(block=block, warps=warps):
            _cross_entropy_rows_kernel[(n,)](logits, logits.stride(0), targets, losses, -1, grad_scale,
                                             n_vocab=V, n_cols=Vp, COMPUTE_GRAD=True, BLOCK=block, num_warps=warps)
        rows.append(KernelTiming(f"classifier softmax pass ({n} rows)", f"{block} columns/block, {warps} warps",
                                 *timed(run), floor))
    return rows


# The scaled-exp classifier's GEMM launches tried: (tile_M, tile_N, cluster_M, cluster_N, ping-pong). The
# logits GEMM's tile_N must divide the padded vocabulary (50304 = 2^7 x 3 x 131: 64, 128, 192)
LOGITS_GEMM_CANDIDATES = ((128, 192, 2, 1, True), (128, 192, 1, 2, True), (128, 192, 1, 1, True),
                          (128, 192, 2, 1, False), (256, 192, 2, 1, False), (256, 192, 1, 2, False),
                          (128, 128, 2, 1, True), (128, 128, 1, 2, True), (256, 128, 2, 1, False),
                          (256, 128, 1, 2, False), (192, 128, 2, 1, True), (128, 64, 1, 2, True))
GRAD_GEMM_CANDIDATES = ((128, 192, 2, 1, False), (128, 192, 1, 2, False), (128, 192, 2, 1, True),
                        (128, 256, 2, 1, False), (128, 256, 1, 2, False), (256, 192, 2, 1, False),
                        (256, 192, 1, 2, False), (256, 128, 2, 1, False), (256, 128, 1, 2, False),
                        (128, 128, 2, 1, True))


def bench_classifier_gemm_configs(cfg: GPTConfig, n: int, ceil: Ceilings) -> list[KernelTiming]:
    """The scaled-exp classifier's three GEMMs (gpt2_kernels/cross_entropy_scaled_exp.py) on one chunk of n rows
    at each candidate launch, beside cuBLAS's plain logits GEMM: the sweep behind LOGITS_GEMM, DX_GEMM and
    DW_GEMM."""
    C, V, Vp = cfg.n_embd, cfg.vocab_size, cfg.padded_vocab_size
    try:
        if cross_entropy.configure_classifier(torch.bfloat16, "cuda", n_embd=C) != "quack-scaled-exp":
            return []
    finally:
        cross_entropy._scaled_exp_on_cuda = False
    from gpt2_kernels import cross_entropy_scaled_exp as scaled_exp

    g = torch.Generator(device="cuda").manual_seed(6)
    x = torch.randn(n, C, device="cuda", dtype=torch.bfloat16, generator=g)
    w = (0.02 * torch.randn(Vp, C, device="cuda", generator=g)).bfloat16()
    targets = torch.randint(0, V, (n,), device="cuda", generator=g)
    mask = scaled_exp.padded_column_mask(Vp, V, x.device)
    E = torch.empty(n, Vp, device="cuda", dtype=torch.bfloat16)
    target_logit, v = torch.empty(n, device="cuda"), torch.full((n,), 1.0 / n, device="cuda")
    u = torch.ones(Vp // scaled_exp.GRAD_TILE_K, n, device="cuda", dtype=torch.bfloat16)
    dx, dw = torch.empty_like(x), torch.empty(Vp, C, device="cuda")
    floor = _floor_ms(2 * n * C * Vp, 2 * n * Vp, ceil)
    rows = [KernelTiming("classifier logits GEMM", "cuBLAS x @ W.T (no softmax)", *timed(lambda: x @ w.t()), floor)]

    def launches(candidates):
        for tile_m, tile_n, cluster_m, cluster_n, pingpong in candidates:
            name = f"{tile_m}x{tile_n} {'ping-pong' if pingpong else 'cooperative'}, cluster {cluster_m}x{cluster_n}"
            yield name, tile_n, dict(tile_M=tile_m, cluster_M=cluster_m, cluster_N=cluster_n, pingpong=pingpong)

    def time_launch(op, name, fn):
        try:
            rows.append(KernelTiming(op, name, *timed(fn), floor))
        except Exception as e:  # noqa: BLE001 - some launches do not fit; the sweep goes on
            print(f"{op}, {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)

    for name, tile_n, launch in launches(LOGITS_GEMM_CANDIDATES):
        if Vp % tile_n:
            continue
        tile_k, tile_sum = (torch.empty(n, Vp // tile_n, device="cuda") for _ in range(2))
        time_launch("classifier logits GEMM + scaled exp", name, lambda tile_n=tile_n, tile_k=tile_k, tile_sum=tile_sum,
                    launch=launch: scaled_exp.scaled_exp_logits(x, w, targets, mask, tile_n, E, tile_k, tile_sum,
                                                                target_logit, **launch))
    for name, tile_n, launch in launches(GRAD_GEMM_CANDIDATES):
        launch = {**launch, "tile_N": tile_n}
        time_launch("classifier dx GEMM (u-scaled E)", name,
                    lambda launch=launch: scaled_exp.scaled_dx(E, u, v, w, dx, **launch))
        time_launch("classifier dW GEMM (u-scaled E)", name,
                    lambda launch=launch: scaled_exp.scaled_dw(E, u, x, dw, accumulate=True, **launch))
    return rows


def bench_add_layernorm(cfg: GPTConfig, N: int, ceil: Ceilings) -> list[KernelTiming]:
    """The training layout: residual (bf16) + branch (bf16, its c_proj bias (fp32) in it, whose gradient
    this op sums) -> (residual, LayerNorm in bf16), forward and backward, both under torch.compile as in
    training (eager, the custom op's Python dispatch shows in the timing); then the backward kernel alone
    in each launch shape its autotuner chooses from."""
    from gpt2_kernels.compile import register_inductor_fallbacks

    register_inductor_fallbacks()
    C = cfg.n_embd
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(N, C, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    y = torch.randn(N, C, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    bias_in_y = torch.zeros(C, device="cuda", requires_grad=True)
    w = torch.ones(C, device="cuda", requires_grad=True)
    b = torch.zeros(C, device="cuda", requires_grad=True)
    d_res = torch.randn(N, C, device="cuda", dtype=torch.bfloat16, generator=g)
    d_out = torch.randn(N, C, device="cuda", dtype=torch.bfloat16, generator=g)

    @torch.compile
    def plain(x, y, w, b):
        r = (x + (y + (bias_in_y - bias_in_y.detach()))).to(torch.bfloat16)  # the bias's gradient, no value
        return r, F.layer_norm(r.float(), (C,), w, b).to(torch.bfloat16)

    def eager(x, y, w, b):
        return add_layernorm(x, y, w, b, out_dtype=torch.bfloat16, bias_in_y=bias_in_y)

    def fwd_bwd(fn):
        def run():
            x.grad = y.grad = w.grad = b.grad = bias_in_y.grad = None
            torch.autograd.backward(fn(x, y, w, b), (d_res, d_out))
        return run

    # bytes per element: forward reads x 2 + y 2, writes residual 2 + out 2; backward reads residual 2
    # + d_out 2 + d_res 2, writes d(residual) 2 (one tensor for x and y)
    floor = _floor_ms(0, 16 * N * C, ceil)
    rows = [KernelTiming("add+layernorm fwd+bwd", "torch.compile", *timed(fwd_bwd(plain)), floor),
            KernelTiming("add+layernorm fwd+bwd", "fused (compiled graph)", *timed(fwd_bwd(torch.compile(eager))),
                         floor),
            KernelTiming("add+layernorm fwd+bwd", "fused (eager)", *timed(fwd_bwd(eager)), floor)]
    return rows + bench_layernorm_backward_configs(N, C, ceil)


def bench_layernorm_backward_configs(N: int, C: int, ceil: Ceilings) -> list[KernelTiming]:
    """The backward op's launcher alone in the training layout (the kernel with its weight, bias and
    c_proj-bias partial sums, and their final reduction) per launch shape in gpt2_kernels.layernorm._BWD_CONFIGS."""
    from gpt2_kernels.layernorm import _BWD_CONFIGS, add_layernorm_backward

    g = torch.Generator(device="cuda").manual_seed(3)
    z, dout, dres = (torch.randn(N, C, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    w = torch.ones(C, device="cuda")
    mean, rstd = torch.zeros(N, device="cuda"), torch.ones(N, device="cuda")
    floor = _floor_ms(0, 8 * N * C, ceil)  # read z 2 + dout 2 + dres 2, write d(residual) 2
    rows = []
    for config in _BWD_CONFIGS:
        def run(config=config):
            add_layernorm_backward(z, w, mean, rstd, dout, dres, torch.bfloat16, torch.bfloat16, has_bias_in_y=True,
                                   config=config)
        impl = f"{config['BLOCK_R']} rows/iteration, {config['num_warps']} warps"
        rows.append(KernelTiming("add+layernorm bwd kernel", impl, *timed(run), floor))
    return rows


def bench_attention(cfg: GPTConfig, B: int, T: int, ceil: Ceilings) -> list[KernelTiming]:
    """Causal attention forward + backward from the packed (B, T, 3C) projection to its gradient, bf16,
    as the model runs it: SDPA per backend (with the split into heads and the q/k/v gradient
    concatenation it implies), and gpt2_kernels.causal_attention's cuDNN + FA4 op where flash-attn-4 is
    installed (unavailable ones are skipped)."""
    from torch.nn.attention import sdpa_kernel

    import gpt2_kernels.attention as attention
    from gpt2.model import sdpa_attention

    nh, C = cfg.n_head, cfg.n_embd
    g = torch.Generator(device="cuda").manual_seed(2)
    qkv = torch.randn(B, T, 3 * C, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    dout = torch.randn(B, T, C, device="cuda", dtype=torch.bfloat16, generator=g)
    floor = _floor_ms(3.5 * 2 * B * nh * T * T * cfg.head_size, 0, ceil)  # causal fwd 2BnhT^2hs; bwd 2.5x fwd
    rows = []
    for name in ("cudnn", "flash", "efficient"):
        def run(name=name):
            qkv.grad = None
            with sdpa_kernel([BACKENDS[name]]):
                sdpa_attention(qkv, nh).backward(dout)
        try:
            rows.append(KernelTiming("causal attention fwd+bwd", f"sdpa {name}", *timed(run), floor))
        except RuntimeError as e:
            print(f"attention backend {name} unavailable: {str(e).splitlines()[0]}")
    try:
        name = attention.configure_attention(nh, cfg.head_size)
        if name.endswith("+fa4-bwd"):
            def packed():
                qkv.grad = None
                attention.causal_attention(qkv, nh).backward(dout)
            rows.append(KernelTiming("causal attention fwd+bwd", "cuDNN fwd + FA4 bwd (packed)", *timed(packed), floor))
    finally:
        attention._fa4_backward_on_cuda = False
        attention.enable_all_sdpa_backends()
    return rows


def bench_mlp(cfg: GPTConfig, N: int, ceil: Ceilings) -> list[KernelTiming]:
    """The MLP branch forward + backward as the fused path runs it (c_proj's bias added in its GEMM, its gradient
    left to add_layernorm), bf16: torch.compile of the plain ops against gpt2_kernels.fused_mlp with quack's GELU
    epilogues, where installed."""
    import gpt2_kernels.mlp as mlp

    C = cfg.n_embd
    g = torch.Generator(device="cuda").manual_seed(4)
    # laid out as add_layernorm writes it for the fused path: c_fc's bias gradient comes from its ones column
    h = with_ones_column(torch.randn(N, C, device="cuda", dtype=torch.bfloat16, generator=g)).requires_grad_()
    dy = torch.randn(N, C, device="cuda", dtype=torch.bfloat16, generator=g)
    w_fc, b_fc, w_proj = ((0.02 * torch.randn(*s, device="cuda", generator=g)).requires_grad_()  # leaves
                          for s in ((4 * C, C), (4 * C,), (C, 4 * C)))
    b_proj = 0.02 * torch.randn(C, device="cuda", generator=g)  # a constant: no gradient here
    floor = _floor_ms(3 * 2 * 2 * N * C * 4 * C, 0, ceil)  # two matmuls, forward and two backward each

    @torch.compile
    def plain(h):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return F.linear(F.gelu(F.linear(h, w_fc, b_fc), approximate="tanh"), w_proj, b_proj)

    def step(branch):
        def run():
            h.grad = w_fc.grad = b_fc.grad = w_proj.grad = None
            branch(h).backward(dy)
        return run

    rows = [KernelTiming("MLP branch fwd+bwd", "torch.compile (GELU passes by Inductor)", *timed(step(plain)), floor)]
    try:
        if mlp.configure_mlp(torch.bfloat16, "cuda", n_embd=C) == "quack-gelu-epilogue":
            fused = step(lambda h: mlp.fused_mlp(h, w_fc, b_fc, w_proj, b_proj, torch.bfloat16))
            rows.append(KernelTiming("MLP branch fwd+bwd", "fused_mlp (quack GELU epilogues)", *timed(fused), floor))
    finally:
        mlp._gelu_epilogue_on_cuda = False
    return rows


# quack's SM90 tile shapes (its autotuner's candidates, ping-pong and cooperative) in both cluster layouts
QUACK_SM90_TILES = ((128, 192, True), (128, 128, True), (128, 160, True), (128, 208, True), (192, 128, True),
                    (128, 224, False), (128, 256, False), (256, 128, False), (256, 160, False), (256, 192, False))


def bench_mlp_gemm_configs(cfg: GPTConfig, N: int, ceil: Ceilings) -> list[KernelTiming]:
    """quack's two MLP GEMMs at each candidate config, one compile (a few seconds) each: the sweep
    behind the backward GEMM's config that gpt2_kernels/mlp.py pins (quack's own autotuner takes minutes at
    these shapes)."""
    import gpt2_kernels.mlp as mlp
    from quack.gemm_config import GemmConfig

    quack = mlp._load_quack()
    if quack is None:
        return []
    C = cfg.n_embd
    g = torch.Generator(device="cuda").manual_seed(5)
    h, dy = (torch.randn(N, C, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    w_fc_t, w_proj = (0.02 * torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
                      for s in ((C, 4 * C), (C, 4 * C)))
    b_fc = torch.zeros(4 * C, device="cuda", dtype=torch.bfloat16)
    pre, _ = quack.gemm_act(h, w_fc_t, bias=b_fc, activation=mlp.GELU, tuned=False)
    dpre, post = torch.empty_like(pre), torch.empty_like(pre)
    floor = _floor_ms(2 * N * C * 4 * C, 0, ceil)
    rows = []
    for tile_m, tile_n, pingpong in QUACK_SM90_TILES:
        for cluster_m, cluster_n in ((2, 1), (1, 2)):
            config = GemmConfig(tile_m=tile_m, tile_n=tile_n, pingpong=pingpong, cluster_m=cluster_m,
                                cluster_n=cluster_n, is_dynamic_persistent=False, device_capacity=9)
            name = f"{tile_m}x{tile_n} {'ping-pong' if pingpong else 'cooperative'}, cluster {cluster_m}x{cluster_n}"
            act = lambda config=config: quack.gemm_act(h, w_fc_t, bias=b_fc, activation=mlp.GELU, config=config)
            dgelu = lambda config=config: quack.dgelu(dy, w_proj, pre, out={"D": dpre, "postact": post}, config=config,
                                                      dynamic_scheduler=True)
            dgelu_kept = lambda config=config: quack.dgelu_no_post(dy, w_proj, pre, out={"D": dpre}, config=config,
                                                                   dynamic_scheduler=True)
            for op, fn in (("c_fc fwd + GELU (gemm_act)", act), ("c_proj dX + GELU bwd, post rebuilt", dgelu),
                           ("c_proj dX + GELU bwd, post kept", dgelu_kept)):
                try:
                    rows.append(KernelTiming(op, name, *timed(fn), floor))
                except Exception as e:  # noqa: BLE001 - some tile shapes do not fit; the sweep goes on
                    print(f"{op}, {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return rows


def bench_linear_gemm_configs(cfg: GPTConfig, N: int, ceil: Ceilings) -> list[KernelTiming]:
    """quack's plain GEMM at each call site of gpt2_kernels/linear.py and gpt2_kernels/mlp.py (N tokens, the model's width)
    at each candidate config, the pinned one marked: the sweep behind those pins (made at d12's shapes) at
    other widths. One compile a config and epilogue (a few seconds each)."""
    import gpt2_kernels.linear as linear

    if linear._load_quack_gemm() is None:
        return []
    C = cfg.n_embd
    g = torch.Generator(device="cuda").manual_seed(6)

    def randn(*shape, scale=1.0):
        return scale * torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    h, w_attn = randn(N, C), randn(3 * C, C, scale=0.02)
    w_proj, w_fc = randn(C, C, scale=0.02), randn(4 * C, C, scale=0.02)
    dqkv, post, dpre, b = randn(N, 3 * C), randn(N, 4 * C), randn(N, 4 * C), randn(4 * C, scale=0.02)
    w_mlp_proj = randn(C, 4 * C, scale=0.02)
    sites = (  # name, pinned tile, a, b, bias
        ("c_attn fwd", linear.C_ATTN_FORWARD, h, w_attn.t(), b[:3 * C]),
        ("c_attn dX", linear.C_ATTN_INPUT_GRAD, dqkv, w_attn, None),
        ("attn c_proj fwd", linear.ATTN_PROJ, h, w_proj.t(), b[:C]),
        ("attn c_proj dX", linear.ATTN_PROJ, h, w_proj, None),
        ("MLP c_proj fwd", linear.MLP_PROJ_FORWARD, post, w_mlp_proj.t(), b[:C]),
        ("MLP c_fc dX", linear.MLP_FC_INPUT_GRAD, dpre, w_fc, None),
    )
    rows = []
    for tile_m, tile_n, pingpong in QUACK_SM90_TILES:
        for cluster_m, cluster_n in ((2, 1), (1, 2)):
            tile = dict(tile_m=tile_m, tile_n=tile_n, pingpong=pingpong, cluster_m=cluster_m, cluster_n=cluster_n)
            name = f"{tile_m}x{tile_n} {'ping-pong' if pingpong else 'cooperative'}, cluster {cluster_m}x{cluster_n}"
            for op, pinned, a, w, bias in sites:
                floor = _floor_ms(2 * a.size(0) * a.size(1) * w.size(1), 0, ceil)
                try:
                    rows.append(KernelTiming(f"{op} ({a.size(0)}x{a.size(1)} @ {w.size(0)}x{w.size(1)})",
                                             name + (" (pinned)" if tile == linear.tile_for(pinned, C) else ""),
                                             *timed(lambda a=a, w=w, bias=bias, tile=tile:
                                                    linear._quack_matmul(a, w, bias, tile)), floor))
                except Exception as e:  # noqa: BLE001 - some tile shapes do not fit; the sweep goes on
                    print(f"{op}, {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    for op, pinned, a, w, bias in sites:  # cuBLAS at each site, for scale
        rows.append(KernelTiming(f"{op} ({a.size(0)}x{a.size(1)} @ {w.size(0)}x{w.size(1)})", "cuBLAS (torch)",
                                 *timed(lambda a=a, w=w, bias=bias:
                                        torch.addmm(bias, a, w) if bias is not None else a @ w),
                                 _floor_ms(2 * a.size(0) * a.size(1) * w.size(1), 0, ceil)))
    return rows


def bench_adamw(cfg: GPTConfig, ceil: Ceilings) -> list[KernelTiming]:
    """One AdamW step over the model's parameters: torch's fused (one kernel) vs foreach."""
    from gpt2.model import GPT
    from gpt2.optim import configure_optimizer

    model = GPT.create(cfg, device="cuda")
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    n = model.num_parameters()
    floor = _floor_ms(0, 4 * n * (4 + 3), ceil)  # read p, g, m, v; write p, m, v (fp32)
    rows = []
    for fused in (True, False):
        opt = configure_optimizer(model, 6e-4, 0.1, fused=fused)
        rows.append(KernelTiming("AdamW step", "torch fused" if fused else "torch foreach", *timed(opt.step), floor))
    return rows


BENCHES = ("classifier", "classifier-gemm", "add-layernorm", "attention", "mlp", "mlp-gemm", "linear-gemm", "adamw")


def run_all(cfg: GPTConfig, B: int, T: int, chunk_rows: tuple[int, ...],
            only: tuple[str, ...] = BENCHES) -> tuple[Ceilings, list[KernelTiming]]:
    ceil = measure_ceilings()
    rows = []
    benches = {"classifier": lambda: bench_classifier(cfg, B * T, ceil, chunk_rows),
               "classifier-gemm": lambda: bench_classifier_gemm_configs(cfg, chunk_rows[0], ceil),
               "add-layernorm": lambda: bench_add_layernorm(cfg, B * T, ceil),
               "attention": lambda: bench_attention(cfg, B, T, ceil), "mlp": lambda: bench_mlp(cfg, B * T, ceil),
               "mlp-gemm": lambda: bench_mlp_gemm_configs(cfg, B * T, ceil),
               "linear-gemm": lambda: bench_linear_gemm_configs(cfg, B * T, ceil),
               "adamw": lambda: bench_adamw(cfg, ceil)}
    for bench in (benches[name] for name in only):
        try:
            rows += bench()
        except Exception:  # noqa: BLE001 - one op's failure must not cost the other rows of a scarce GPU run
            print(f"FAILED:\n{traceback.format_exc()}", flush=True)
        torch.cuda.empty_cache()
    return ceil, rows


def format_table(ceil: Ceilings, rows: list[KernelTiming]) -> str:
    lines = [f"ceilings: bf16 matmul {ceil.matmul_tflops:.0f} TFLOP/s, copy {ceil.copy_tbps:.2f} TB/s", "",
             "| op | implementation | ms | floor ms | extra GPU memory GB |", "| --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        floor = f"{r.floor_ms:.2f}" if r.floor_ms is not None else ""
        lines.append(f"| {r.op} | {r.impl} | {r.ms:.2f} | {floor} | {r.extra_mem_gb:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="d12", help="model descriptor (default d12)")
    parser.add_argument("--batch-size", type=int, default=64, help="micro-batch B (default 64)")
    parser.add_argument("--seq-len", type=int, default=1024, help="sequence length T (default 1024)")
    parser.add_argument("--chunk-rows", type=int, nargs="+", default=[8192, 16384],
                        help="fused classifier chunk sizes to time (default 8192 16384)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--only", nargs="+", choices=BENCHES, default=list(BENCHES),
                        help="run these benches only (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    ceil, rows = run_all(GPTConfig.from_descriptor(args.model), args.batch_size, args.seq_len, tuple(args.chunk_rows),
                         tuple(args.only))
    print(format_table(ceil, rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ceilings": asdict(ceil), "rows": [asdict(r) for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
