"""GPT-2's MLP with the tanh GELU inside its matmuls' epilogues (quack's CuTe GEMMs), where installed.

    forward:   pre, post = h @ W_fcᵀ + b_fc, gelu(pre)      one GEMM writes both (quack gemm_act)
               y = post @ W_projᵀ + b_proj                  gpt2_kernels.linear.matmul, b_proj in its epilogue
    backward:  dpre, post = (dy @ W_proj) ∘ gelu'(pre), gelu(pre)   one GEMM, reading pre in its epilogue
                                                           (dgelu); with post kept, it writes dpre alone
               dW_proj = dyᵀ post;  [dW_fc | db_fc] = dpreᵀ [h | 1];  dh = dpre W_fc
                                                           cuBLAS, weight grads out in fp32 (dW_proj
                                                           added into the gradient buffer where given)

Inductor runs the GELU as separate passes over the (B·T, 4C) activations: forward reads pre and writes
post, backward writes dpost from the matmul and reads it back with pre. Inside the GEMMs those passes
go (d12 on H100 per layer and micro-step: 0.49 ms for gemm_act against 0.45 + 0.27 for addmm + GELU;
docs/benchmarks.md). The c_fc bias gradient comes out of the dW_fc GEMM: h arrives from add_layernorm with
a column of ones (gpt2_kernels/linear.py), cheaper than a column sum in the backward GEMM's epilogue (0.07-0.11 ms
a call at d12 on an H100, against 0.05 for the wider dW_fc GEMM). c_proj's bias is a constant to this op:
its gradient, Σ_rows dy, comes from the add_layernorm after the MLP (`bias_in_y`), which sums d(residual)
anyway (gpt2_kernels.linear.projection says why the bias is added here all the same). pre is kept for backward;
post, which dW_proj needs, is either rebuilt by the backward GEMM (a third of its epilogue's traffic) or,
with `keep_post`, kept from the forward at the price of its memory (`layers_keeping_post`, within the
budget configure_mlp is given: gpt2.train's `keep_mlp_post_gb`, 2.5 GB by default).

`configure_mlp` turns the op on for CUDA where quack-kernels (an optional GPU dependency, Hopper and
newer) is installed and agrees with the reference; elsewhere the fused model keeps the plain MLP, which
torch.compile fuses itself. On CPU the op runs its PyTorch reference (`mlp_reference_*`), so the op's
wiring is tested without a GPU.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from gpt2_kernels._quack import CHECK_TOLERANCE, max_relative_error, quack_capability
from gpt2_kernels.linear import (EXACT_STRIDES, MLP_FC_FORWARD, MLP_FC_INPUT_GRAD, MLP_PROJ_FORWARD, augmented,
                            compute_copy, empty_weight_grad, fake_for_backward, fake_weight_gradient, for_backward,
                            gemm_config, in_dtype, kept_weight, matmul, tile_for, weight_and_bias_grads,
                            weight_gradient, with_ones_column)

GELU = "gelu_tanh_approx"  # quack's name for GPT-2's GELU, F.gelu(approximate="tanh")

# Whether the fused model's MLP runs this op on CUDA; set by configure_mlp before a model is compiled
_gelu_epilogue_on_cuda = False


# Bytes of GPU memory the fused MLPs may spend keeping post for backward, so that the backward GEMM writes
# dpre alone (configure_mlp's keep_post_bytes; 0: none): at d12 and B x T = 65,536 rows, 0.40 GB and about
# 1 ms a step per layer (docs/benchmarks.md)
_kept_post_bytes = 0.0


class QuackGemms(NamedTuple):
    gemm_act: Callable  # quack.gemm_interface.gemm_act
    dgelu: Callable  # quack.epilogue.library.dgelu_mod: D = dpre, postact = gelu(pre)
    dgelu_no_post: Callable  # the same without postact: D = dpre
    dgelu_config: object  # the quack.gemm_config.GemmConfig each is pinned to
    dgelu_no_post_config: object


@functools.cache
def _load_quack() -> QuackGemms | None:
    """quack's GEMMs with their pinned configs, or None where quack is not installed or the GPU
    predates Hopper."""
    if quack_capability() is None:
        return None
    from quack.activation import dgelu_tanh_approx
    from quack.epilogue.frontend import gemm_epilogue
    from quack.epilogue.library import dgelu_mod
    from quack.gemm_config import GemmConfig
    from quack.gemm_interface import gemm_act

    @gemm_epilogue()
    def dgelu_no_post(acc, c):  # dgelu_mod less its postact store: c is pre, acc is dpost
        dx, _ = dgelu_tanh_approx(c, acc)
        return {"D": dx}

    # quack's autotuner takes minutes at these shapes. Measured at d12's shape on an H100 (2026-11-27, one call;
    # bench_kernels.py's bench_mlp_gemm_configs sweeps them all), the fastest of five for each form of the
    # backward GEMM: with postact 128 x 192 ping-pong, cluster 1 x 2, 0.69 ms against 0.75 for 128 x 128 (the
    # best while the epilogue also summed dbias) and 0.73 for quack's untuned default (128 x 192, cluster
    # 2 x 1); without postact 192 x 128, cluster 1 x 2, 0.62 ms against 0.64 at 128 x 192 and 0.67 for the
    # default. gemm_act's tile is pinned per width in gpt2_kernels.linear's MLP_FC_FORWARD. A config is valid at any
    # shape.
    def pinned(tile_m, tile_n):
        return GemmConfig(tile_m=tile_m, tile_n=tile_n, pingpong=True, cluster_m=1, cluster_n=2,
                          is_dynamic_persistent=False, device_capacity=9)

    return QuackGemms(gemm_act, dgelu_mod, dgelu_no_post, dgelu_config=pinned(128, 192),
                      dgelu_no_post_config=pinned(192, 128))


def configure_mlp(dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cuda",
                  gelu_epilogue: bool = True, n_embd: int = 768, keep_post_bytes: float = 0.0) -> str:
    """Enable the GELU-epilogue MLP on CUDA where quack runs and matches the reference, with up to
    keep_post_bytes of post kept for backward (`layers_keeping_post`); returns what runs."""
    global _gelu_epilogue_on_cuda, _kept_post_bytes
    _gelu_epilogue_on_cuda = False
    _kept_post_bytes = keep_post_bytes
    if not (gelu_epilogue and dtype in (torch.bfloat16, torch.float16) and _load_quack() is not None):
        return "inductor-gelu"
    g = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(512, n_embd, device=device, dtype=dtype, generator=g)
    dy = torch.randn(512, n_embd, device=device, dtype=dtype, generator=g)
    w_fc, b_fc, w_proj, b_proj = (0.02 * torch.randn(*s, device=device, generator=g)
                                  for s in ((4 * n_embd, n_embd), (4 * n_embd,), (n_embd, 4 * n_embd), (n_embd,)))
    h = with_ones_column(h)
    ref_y, ref_pre, _ = mlp_reference_fwd(h.float(), w_fc, b_fc, w_proj, b_proj)
    ref_grads = mlp_reference_bwd(dy.float(), h, ref_pre, ref_pre.new_empty(0), w_fc, w_proj)
    pairs = []
    for keep_post in (False, True) if keep_post_bytes else (False,):  # post rebuilt, and kept where configured
        y, pre, post, w_fc_c, w_proj_c = _mlp_fwd(h, w_fc, b_fc, w_proj, b_proj, dtype, keep_post, None, None, None)
        grads = _mlp_bwd(dy, h, pre, post, w_fc_c, w_proj_c, w_fc.dtype, None)
        pairs += zip((y, *grads[:4]), (ref_y, *ref_grads[:4]))
    err = max_relative_error(pairs)
    if err > CHECK_TOLERANCE:
        raise RuntimeError(f"quack's GELU-epilogue GEMMs disagree with the reference at width {n_embd}: "
                           f"relative error {err:.2e}; `pip uninstall flash-attn-4 quack-kernels` (the gpu "
                           "extra) to train without them")
    _gelu_epilogue_on_cuda = True
    return "quack-gelu-epilogue"


def gelu_epilogue_enabled(device: torch.device) -> bool:
    """Whether the fused model runs its MLP through `mlp` on `device` (always on CPU: the reference)."""
    return device.type == "cpu" or (device.type == "cuda" and _gelu_epilogue_on_cuda)


def layers_keeping_post(n_layer: int, rows: int, hidden: int, act_dtype: torch.dtype) -> int:
    """How many of n_layer MLPs keep post (rows x hidden in act_dtype each) within configure_mlp's
    keep_post_bytes."""
    return min(n_layer, int(_kept_post_bytes // (rows * hidden * act_dtype.itemsize)))


def fused_mlp(h: torch.Tensor, w_fc: torch.Tensor, b_fc: torch.Tensor, w_proj: torch.Tensor,
        b_proj: torch.Tensor | None, act_dtype: torch.dtype, keep_post: bool = False,
        cast_weights: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
        proj_weight_grad: torch.Tensor | None = None) -> torch.Tensor:
    """h (..., C) -> c_proj(gelu(c_fc(h))) (..., C) in act_dtype; b_proj=None leaves c_proj's bias out.
    h carries a column of ones (gpt2_kernels/linear.py: add_layernorm(..., ones_column=True) or with_ones_column).

    The weights are the fp32 parameters; they are cast to act_dtype inside, as autocast would (custom ops
    do not see autocast), once: the backward keeps the casts; `cast_weights`, (W_fc, W_proj) already in
    act_dtype, are used instead where the caller has them (None: that one cast here). Their gradients come
    back in fp32, but for b_proj's: added in c_proj's GEMM as a constant (taken detached), its gradient,
    Σ_rows dy, is the next add_layernorm's to sum (`bias_in_y`), as for gpt2_kernels.linear.projection. `keep_post`
    keeps the GELU's output for backward (its memory, (..., 4C) in act_dtype) instead of having the backward
    GEMM rebuild it. With `proj_weight_grad` (W_proj's shape in fp32: the gradient buffer's view), the backward's
    dW_proj GEMM adds into it and autograd gets none for W_proj (gpt2_kernels.linear.weight_gradient)."""
    C = h.size(-1)
    b_proj = b_proj.detach() if b_proj is not None else None
    y = _mlp_fwd(h.reshape(-1, C), w_fc, b_fc, w_proj, b_proj, act_dtype, keep_post, *cast_weights,
                 proj_weight_grad)[0]
    return y.view(h.shape)


@torch.library.custom_op("gpt2_kernels::mlp_fwd", mutates_args=(), tags=EXACT_STRIDES)
def _mlp_fwd(h: torch.Tensor, w_fc: torch.Tensor, b_fc: torch.Tensor, w_proj: torch.Tensor,
             b_proj: torch.Tensor | None, act_dtype: torch.dtype, keep_post: bool, w_fc_c: torch.Tensor | None,
             w_proj_c: torch.Tensor | None, w_proj_grad: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """h (N, C) -> (y (N, C), pre (N, 4C), the GELU's input, and with keep_post its output post (N, 4C),
    else an empty tensor, then W_fc and W_proj as gpt2_kernels.linear.for_backward returns them), all in act_dtype;
    pre, post and the weights are for backward. h carries the ones column; w_fc_c and w_proj_c: the caller's
    casts of the weights to act_dtype, or None to cast them here; w_proj_grad is the backward's (`fused_mlp`)."""
    augmented(h)  # fail here, not in backward, on an input without the column
    h, b_fc = h.to(act_dtype), b_fc.to(act_dtype)
    w_fc, w_proj = compute_copy(w_fc, act_dtype, w_fc_c), compute_copy(w_proj, act_dtype, w_proj_c)
    b_proj = b_proj.to(act_dtype) if b_proj is not None else None
    if not h.is_cuda:
        y, pre, post = mlp_reference_fwd(h, w_fc, b_fc, w_proj, b_proj)
    else:
        pre, post = _load_quack().gemm_act(h, w_fc.t(), bias=b_fc, activation=GELU, store_preact=True, tuned=False,
                                           config=gemm_config(tile_for(MLP_FC_FORWARD, h.size(1))))  # (N, 4C) each
        y = matmul(post, w_proj.t(), b_proj, tile_for(MLP_PROJ_FORWARD, w_proj.size(0)))  # (N, C)
    return (y, pre, post if keep_post else pre.new_empty(0), for_backward(w_fc, w_fc_c),
            for_backward(w_proj, w_proj_c))


@_mlp_fwd.register_fake
def _(h, w_fc, b_fc, w_proj, b_proj, act_dtype, keep_post, w_fc_c, w_proj_c, w_proj_grad):
    N, C = h.shape
    hidden = h.new_empty(N, w_fc.size(0), dtype=act_dtype)
    post = torch.empty_like(hidden) if keep_post else hidden.new_empty(0)
    return (h.new_empty(N, C, dtype=act_dtype), hidden, post, fake_for_backward(w_fc, w_fc_c, act_dtype),
            fake_for_backward(w_proj, w_proj_c, act_dtype))


@torch.library.custom_op("gpt2_kernels::mlp_bwd", mutates_args=("w_proj_grad",), tags=EXACT_STRIDES)
def _mlp_bwd(dy: torch.Tensor, h: torch.Tensor, pre: torch.Tensor, post: torch.Tensor, w_fc: torch.Tensor,
             w_proj: torch.Tensor, grad_dtype: torch.dtype, w_proj_grad: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dh (N, C) in pre's dtype; dW_fc, db_fc, dW_proj in grad_dtype, the parameters'; with w_proj_grad, dW_proj
    is added into it and comes back empty). The weights in the compute dtype (the forward's casts); post: the
    forward's (N, 4C), or empty to have it rebuilt from pre."""
    dtype = pre.dtype
    if not dy.is_cuda:
        return mlp_reference_bwd(dy, h, pre, post, w_fc, w_proj, grad_dtype, w_proj_grad)
    quack = _load_quack()
    dy, h = dy.to(dtype), in_dtype(h, dtype)  # w_fc and w_proj come in dtype: the forward's casts
    if post.numel():  # (N, 4C)
        out = quack.dgelu_no_post(dy, w_proj, pre, out={"D": torch.empty_like(pre)},
                                  config=quack.dgelu_no_post_config, dynamic_scheduler=True)
    else:  # (N, 4C), (N, 4C)
        out = quack.dgelu(dy, w_proj, pre, out={"D": torch.empty_like(pre), "postact": torch.empty_like(pre)},
                          config=quack.dgelu_config, dynamic_scheduler=True)
        post = out["postact"]
    return _weight_grads(dy, h, out["D"], post, w_fc, grad_dtype, w_proj_grad)


@_mlp_bwd.register_fake
def _(dy, h, pre, post, w_fc, w_proj, grad_dtype, w_proj_grad):
    return (h.new_empty(h.shape, dtype=pre.dtype), empty_weight_grad(w_fc, grad_dtype),
            w_fc.new_empty(w_fc.size(0), dtype=grad_dtype), fake_weight_gradient(w_proj, grad_dtype, w_proj_grad))


def _weight_grads(dy, h, dpre, post, w_fc, dtype, w_proj_grad):
    """The matmul gradients shared by the quack path and the reference; c_fc's bias gradient from the dW_fc
    GEMM, through h's column of ones. dtype: the parameters' (fp32 in training), which the weight gradients
    come out in; dW_proj added into w_proj_grad where given."""
    dh = matmul(dpre, w_fc.to(dpre.dtype), None, tile_for(MLP_FC_INPUT_GRAD, w_fc.size(1)))  # (N, C)
    dw_fc, db_fc = weight_and_bias_grads(dpre, h, dtype)  # dW_fc as the GEMM left it
    return dh, dw_fc, db_fc, weight_gradient(dy, post, dtype, w_proj_grad)


def _setup_context(ctx, inputs, output):
    h, w_fc, _, _, _, _, _, w_fc_cast, w_proj_cast, w_proj_grad = inputs
    _, pre, post, w_fc_c, w_proj_c = output
    ctx.save_for_backward(h, pre, post, kept_weight(w_fc_cast, w_fc_c), kept_weight(w_proj_cast, w_proj_c))
    ctx.w_proj_grad = w_proj_grad  # on ctx, not saved: a view of the gradient buffer (as in gpt2_kernels/linear.py)
    ctx.h_dtype, ctx.grad_dtype = h.dtype, w_fc.dtype
    ctx.mark_non_differentiable(pre, post, w_fc_c, w_proj_c)


def _backward(ctx, dy, _dpre, _dpost, _dw_fc, _dw_proj):
    h, pre, post, w_fc, w_proj = ctx.saved_tensors
    dh, dw_fc, db_fc, dw_proj = _mlp_bwd(dy.contiguous(), h, pre, post, w_fc, w_proj, ctx.grad_dtype,
                                         ctx.w_proj_grad)
    dw_proj = dw_proj if ctx.w_proj_grad is None else None  # else added into w_proj_grad
    return dh.to(ctx.h_dtype), dw_fc, db_fc, dw_proj, None, None, None, None, None, None  # b_proj: a constant


_mlp_fwd.register_autograd(_backward, setup_context=_setup_context)


def mlp_reference_fwd(h, w_fc, b_fc, w_proj, b_proj):
    """The op's forward in plain PyTorch (in h's dtype): (y, pre, post)."""
    pre = F.linear(h, w_fc.to(h.dtype), b_fc.to(h.dtype))
    post = F.gelu(pre, approximate="tanh")
    return F.linear(post, w_proj.to(h.dtype), b_proj.to(h.dtype) if b_proj is not None else None), pre, post


def mlp_reference_bwd(dy, h, pre, post, w_fc, w_proj, grad_dtype=None, w_proj_grad=None):
    """The op's backward in plain PyTorch: GELU's derivative written out, then `_weight_grads`; post is
    the forward's, or empty to rebuild it from pre as the backward GEMM does. h carries the ones column; the
    gradients come in grad_dtype (default: the weights'), dW_proj added into w_proj_grad where given."""
    dpost = dy.to(pre.dtype) @ w_proj.to(pre.dtype)  # (N, 4C)
    x = pre.to(torch.promote_types(pre.dtype, torch.float32))  # bf16 math in fp32, fp64 tests in fp64
    inner = 0.7978845608028654 * (x + 0.044715 * x**3)  # √(2/π)(x + 0.044715x³)
    t = torch.tanh(inner)
    dgelu = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x)
    dpre = (dpost.to(x.dtype) * dgelu).to(pre.dtype)
    if not post.numel():
        post = (0.5 * x * (1 + t)).to(pre.dtype)
    return _weight_grads(dy.to(pre.dtype), in_dtype(h, pre.dtype), dpre, post, w_fc, grad_dtype or w_fc.dtype,
                         w_proj_grad)
