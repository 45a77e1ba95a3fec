"""Bias gradients out of the weight-gradient GEMM, through a column of ones beside the input.

A linear layer's bias gradient is the column sum of its output gradient, Σ_rows dy: in GPT-2's backward a
separate pass over dy (for c_attn, (B·T, 3C): 0.14 ms a call at d12 on an H100, about 10 ms a step). If the
input h carries a column of ones after its C columns, the weight-gradient GEMM gives that sum for free:

    dyᵀ [h | 1] = [dyᵀ h | dyᵀ 1] = [dW | db]

The LayerNorms whose outputs feed c_attn and c_fc write that column (`add_layernorm(..., ones_column=True)`):
each output row sits in a wider row of `padded_width(C)` elements, column C holding 1 and columns C+1 to
C+7 zeros, so the GEMM reads an (N, C + 8) operand whose rows stay 16-byte aligned. The row stride is a
multiple of 64 elements, so that in bf16 every row starts on a 128-byte line: at d12 a stride of C + 8
cost quack's forward GELU GEMM 25% (0.53 → 0.67 ms, H100), each tile row then straddling two lines.

On an H100 at d12 the GEMM with the 8 extra columns costs what the plain one does at c_attn's shape (0.38 ms)
and 0.05 ms more at c_fc's (0.49 ms); docs/benchmarks.md has the measurements.

`biased_linear` is c_attn's op; gpt2_kernels/mlp.py takes c_fc's bias gradient the same way
(`weight_and_bias_grads`). `with_ones_column` gives any (..., C) tensor the layout (a copy), for callers
that do not get h from add_layernorm.

`projection` is attention's c_proj: its bias goes into the GEMM's epilogue, its bias gradient comes from the
add_layernorm after it (`bias_in_y`), which sums d(residual) anyway. Given the weight's gradient buffer
(`weight_grad`: gpt2.step.FlatGradients' view), its weight-gradient GEMM adds into it (`weight_gradient`), as llm.c
accumulates its gradients; c_attn's and c_fc's cannot, their [dW | db] product being rows C + 8 apart.

`matmul` is the block's forward and input-gradient GEMM (c_attn, attention's c_proj through `projection`,
the MLP's c_proj and c_fc in gpt2_kernels/mlp.py): on a Hopper GPU with the `gpu` extra, quack's GEMM at a tile
pinned per call site (`configure_linear` turns it on once it agrees with torch's), else torch's. At d12 on
an H100 it took 3-12% less time than cuBLAS at each of those six GEMMs, with bit for bit the same output
(docs/benchmarks.md); the weight-gradient GEMMs stay with cuBLAS, which was faster there.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from gpt2_kernels._quack import CHECK_TOLERANCE, max_relative_error, quack_capability

ONES_COLUMNS = 8  # the column of ones, then zeros: C + 8 columns keep a bf16 row a multiple of 16 bytes
_ROW_ALIGN = 64  # elements: 128 bytes in bf16
# The ops that read the column past h's last take h with the strides it came with: no compiler copy into a
# dense layout, which would drop the column (an op finding h without it raises rather than reading past it)
EXACT_STRIDES = tuple(t for t in (getattr(torch.Tag, "needs_exact_strides", None),) if t is not None)


def _tile(tile_m: int, tile_n: int, pingpong: bool, cluster_m: int, cluster_n: int) -> dict:
    return dict(tile_m=tile_m, tile_n=tile_n, pingpong=pingpong, cluster_m=cluster_m, cluster_n=cluster_n)


# quack GEMM tiles (M x N, ping-pong or cooperative, cluster M x N) pinned per call site and model width C (the
# tables' keys; `tile_for` picks one). At d12's 768, the default for widths not listed: the fastest of twelve at
# d12's shapes on an H100 (2026-11-27, bench/results/2026-11-27/12-*/mb_gemm.txt), against cuBLAS per call. At
# d24's 1024 and d48's 1600: the fastest of twenty at those models' shapes on an H200 (2026-11-28, `bench_kernels
# --only linear-gemm`, docs/benchmarks.md), where d12's 192-wide tiles cover a C-wide output unevenly (1024 and
# 1600 are no multiples of 192), µs against d12's pin (d24 at B=32, d48 at B=16; T=1024):
C_ATTN_FORWARD = {768: _tile(128, 192, True, 1, 2),  # 305 against 345 us
                  1600: _tile(128, 160, True, 1, 2)}  # 355 against 365
C_ATTN_INPUT_GRAD = {768: _tile(128, 192, True, 2, 1),  # 305 against 345
                     1024: _tile(128, 256, False, 1, 2),  # 288 against 314
                     1600: _tile(256, 160, False, 1, 2)}  # 351 against 394
MLP_PROJ_FORWARD = {768: _tile(128, 192, True, 1, 2),  # 431 against 446
                    1024: _tile(128, 256, False, 1, 2),  # 390 against 429
                    1600: _tile(256, 160, False, 1, 2)}  # 471 against 589
MLP_FC_INPUT_GRAD = {768: _tile(256, 192, False, 1, 2),  # 428 against 448
                     1024: _tile(128, 256, False, 1, 2),  # 397 against 417
                     1600: _tile(256, 160, False, 1, 2)}  # 473 against 524
ATTN_PROJ = {768: _tile(128, 192, True, 2, 1),  # 112 against 123 and 128
             1024: _tile(192, 128, True, 1, 2),  # forward 101 against 114, input gradient 99 against 116
             1600: _tile(128, 160, True, 1, 2)}  # forward 120 against 131, input gradient 122 against 131
# The MLP's c_fc forward with GELU in its epilogue (gpt2_kernels/mlp.py, quack's gemm_act): at 768 quack's own SM90
# default, within noise of the best at d12 (2026-11-23); at 1600 the fastest of twenty in two calls at d48's shape
# and strides, 2-3% under that default (2026-11-29, bench/results/2026-11-29/5-gemm-act-tiles-d48-h200; 6400 =
# 40 x 160, where 192 leaves a ragged 64-wide tile)
MLP_FC_FORWARD = {768: _tile(128, 192, True, 2, 1),
                  1600: _tile(128, 160, True, 1, 2)}  # 498 / 514 against 514 / 526 us
# (c_proj's forward tiles at 768 were measured without their bias, which the epilogue now adds: one (C,) read a tile)
# At 1600 they were timed against cuBLAS too, at d48's exact strides (2026-11-29, two H200s, bench/results/2026-11-29/
# 4-gemm-cublas-d48-h200): quack 5-13% faster at the three forward sites, 0-4% at c_proj's input gradient; at
# c_attn's and c_fc's input gradients cuBLAS was up to 1.1% faster on one machine and behind on the other, so no
# site hands width 1600 to torch's GEMM
DEFAULT_TILE_WIDTH = 768


def tile_for(site: dict[int, dict], width: int) -> dict:
    """A call site's tile (one of the tables above) at model width `width`; d12's where the width has none."""
    return site.get(width, site[DEFAULT_TILE_WIDTH])


# Whether `matmul` runs quack's GEMM on CUDA; set by configure_linear before a model is compiled
_quack_gemm_on_cuda = False


@functools.cache
def _load_quack_gemm() -> Callable | None:
    """quack's GEMM taking a pinned config (out written in place), where quack runs on an SM90 GPU: the tiles
    above were measured there."""
    if quack_capability() != (9, 0):
        return None
    from quack.gemm_interface import gemm_tuned

    def gemm(a, b, out, bias, tile):
        gemm_tuned.fn(a, b, out, bias=bias, config=gemm_config(tile))

    return gemm


def gemm_config(tile: dict):
    """quack's GemmConfig for a pinned tile: SM90's, on the static persistent scheduler the tiles were timed with."""
    from quack.gemm_config import GemmConfig

    return GemmConfig(**tile, is_dynamic_persistent=False, device_capacity=9)


def configure_linear(dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cuda",
                     quack_gemm: bool = True, n_embd: int = 768) -> str:
    """Turn quack's GEMM on for `matmul` where it runs and agrees with torch's at this width; returns what
    runs ("quack-gemm" or "torch-gemm")."""
    global _quack_gemm_on_cuda
    _quack_gemm_on_cuda = False
    if not (quack_gemm and dtype in (torch.bfloat16, torch.float16) and _load_quack_gemm() is not None):
        return "torch-gemm"
    g = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(512, n_embd, device=device, dtype=dtype, generator=g)
    w = 0.02 * torch.randn(3 * n_embd, n_embd, device=device, dtype=dtype, generator=g)
    b = torch.randn(3 * n_embd, device=device, dtype=dtype, generator=g)
    forward, input_grad = tile_for(C_ATTN_FORWARD, n_embd), tile_for(C_ATTN_INPUT_GRAD, n_embd)
    pairs = [(_quack_matmul(h, w.t(), b, forward), torch.addmm(b.float(), h.float(), w.float().t())),
             (_quack_matmul(h @ w.t(), w, None, input_grad), (h @ w.t()).float() @ w.float())]
    if (err := max_relative_error(pairs)) > CHECK_TOLERANCE:
        raise RuntimeError(f"quack's GEMM disagrees with torch's at width {n_embd}: relative error {err:.2e}; "
                           "`pip uninstall flash-attn-4 quack-kernels` (the gpu extra) to train without it")
    _quack_gemm_on_cuda = True
    return "quack-gemm"


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, tile: dict) -> torch.Tensor:
    """a (M, K) @ b (K, N) + bias (N,) in a's dtype (a, b and bias in one dtype): quack's GEMM at `tile` where
    configure_linear turned it on and the operands suit it, else torch's."""
    if _quack_gemm_on_cuda and a.is_cuda and _suits_quack(a, b, bias):
        return _quack_matmul(a, b, bias, tile)
    return torch.addmm(bias, a, b) if bias is not None else a @ b


def _quack_matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, tile: dict) -> torch.Tensor:
    out = a.new_empty(a.size(0), b.size(1))
    _load_quack_gemm()(a, b, out, bias, tile)
    return out


def _suits_quack(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """16-bit operands of one dtype (quack's SM90 GEMM takes no fp32 inputs: the fp32 references run torch's),
    each one a TMA load can read."""
    dtypes = {t.dtype for t in (a, b, bias) if t is not None}
    return len(dtypes) == 1 and dtypes <= {torch.bfloat16, torch.float16} and all(map(_tma_loadable, (a, b)))


def _tma_loadable(t: torch.Tensor) -> bool:
    """A 2-D operand a TMA load can read: one unit stride, the other a multiple of 16 bytes, 16-byte aligned."""
    if t.dim() != 2 or 1 not in t.stride() or t.data_ptr() % 16:
        return False
    return all(s % (16 // t.element_size()) == 0 for s in t.stride() if s != 1)


def padded_width(C: int) -> int:
    """The row stride of an output that carries the ones column: C + 8 rounded up to 64 elements."""
    return -(-(C + ONES_COLUMNS) // _ROW_ALIGN) * _ROW_ALIGN


def empty_with_ones_column(N: int, C: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An (N, C) tensor to be written, whose rows lie in (N, padded_width(C)) storage with column C set to
    one and columns C+1 to C+7 to zero."""
    storage = torch.empty(N, padded_width(C), dtype=dtype, device=device)
    storage[:, C:C + ONES_COLUMNS] = 0
    storage[:, C] = 1
    return storage[:, :C]


def with_ones_column(h: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """h (..., C) copied (and cast to dtype) into the layout that `biased_linear` and `gpt2_kernels.fused_mlp` read."""
    C = h.size(-1)
    out = empty_with_ones_column(h.numel() // C, C, dtype or h.dtype, h.device)
    out.copy_(h.reshape(-1, C))
    return out.view(h.shape)


def in_dtype(h: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """h in the ones-column layout, in dtype: h itself when it has that dtype, else a cast copy."""
    return h if h.dtype == dtype else with_ones_column(h, dtype)


def augmented(h: torch.Tensor) -> torch.Tensor:
    """h (N, C) in the ones-column layout -> the (N, C + 8) operand [h | 1 | 0...] in the same storage."""
    N, C = h.shape
    width = C + ONES_COLUMNS
    row_stride = h.stride(0) if N > 1 else width  # a single row's stride says nothing
    end = h.storage_offset() + (N - 1) * row_stride + width  # in elements, past the last row's column
    if h.stride(1) != 1 or row_stride < width or end * h.element_size() > h.untyped_storage().nbytes():
        raise ValueError(f"h {tuple(h.shape)} with strides {h.stride()} does not carry a ones column: pass the "
                         "output of add_layernorm(..., ones_column=True) or gpt2_kernels.linear.with_ones_column(h)")
    return h.as_strided((N, width), (row_stride, 1))


def weight_and_bias_grads(dy: torch.Tensor, h: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(dW (out, C), db (out,)) in dtype of a linear layer y = h Wᵀ + b, from dy (N, out) and h (N, C) in
    the ones-column layout: one GEMM, dyᵀ [h | 1], its fp32 accumulator written in dtype (fp32 in training).

    dW is the product's first C columns as they lie, rows C + 8 apart (`empty_weight_grad`'s layout): the
    gradient accumulation reads it once either way, and a dense copy first is a pass more over it (c_attn's
    and c_fc's copies took 25 ms of a 2.39 s d48 step on an H200). db, a few kilobytes, is copied: a custom
    op's outputs may not alias each other."""
    C = h.size(1)
    dwb = matmul_out(dy.t(), augmented(h), dtype)  # (out, C + 8): dW, db, then zeros
    return dwb[:, :C], dwb[:, C].clone()


def empty_weight_grad(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An (out, C) tensor laid out as `weight_and_bias_grads` returns dW: rows C + 8 apart (fake kernels)."""
    out, C = weight.shape
    return weight.new_empty(out, C + ONES_COLUMNS, dtype=dtype)[:, :C]


def matmul_out(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a @ b in dtype, never rounded to a's dtype first: on CUDA a bf16 product comes out of the matmul's
    fp32 accumulator as fp32 itself (no separate cast pass); CPU has no such kernel and multiplies the
    same values in dtype, as gpt2_kernels.cross_entropy.accumulate_dw does."""
    if a.is_cuda and dtype == torch.float32 and a.dtype != dtype:
        return torch.mm(a, b, out_dtype=dtype)
    return a.to(dtype) @ b.to(dtype)


def accumulate_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out += a @ b, the product in out's dtype, never rounded to a's first (as `matmul_out`): on CUDA the GEMM adds
    it to what out holds (cuBLAS's beta = 1), so no product is written to memory and read back by a separate add.
    On an H200 at d48's c_proj weight-gradient shapes that is the same bits as `matmul_out`'s product added after,
    in about the time of the GEMM alone (113 against 119 µs, 436 against 456; docs/benchmarks.md). On the CPU the same
    values in out's dtype, through BLAS's beta = 1, which may add the product in parts (the bits can differ)."""
    if a.is_cuda and a.dtype != out.dtype:
        torch.addmm(out, a, b, out_dtype=out.dtype, out=out)
    else:
        out.addmm_(a.to(out.dtype), b.to(out.dtype))


def weight_gradient(dy: torch.Tensor, h: torch.Tensor, dtype: torch.dtype, into: torch.Tensor | None) -> torch.Tensor:
    """A linear layer's dW = dyᵀ h in dtype (`matmul_out`); with `into` (the parameter's gradient, in dtype) added
    into it by the GEMM (`accumulate_matmul`) instead, and an empty tensor returned."""
    if into is None:
        return matmul_out(dy.t(), h, dtype)
    accumulate_matmul(dy.t(), h, into)
    return into.new_empty(0)


def fake_weight_gradient(weight: torch.Tensor, dtype: torch.dtype, into: torch.Tensor | None) -> torch.Tensor:
    """`weight_gradient`'s output in a fake kernel."""
    return weight.new_empty(weight.shape if into is None else (0,), dtype=dtype)


def biased_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                  cast_weight: torch.Tensor | None = None) -> torch.Tensor:
    """h (..., C) in the ones-column layout -> h Wᵀ + b (..., out) in h's dtype (the weights are cast to it,
    as autocast would: custom ops do not see autocast; `cast_weight`, weight already in h's dtype, is used
    instead where the caller has it); the gradients of weight and bias come from one GEMM in weight's dtype."""
    C = h.size(-1)
    y = _biased_linear(h.reshape(-1, C), weight, bias, cast_weight)[0]
    return y.view(*h.shape[:-1], weight.size(0))


def compute_copy(weight: torch.Tensor, dtype: torch.dtype, cast: torch.Tensor | None = None) -> torch.Tensor:
    """weight in the compute dtype for an op's GEMMs: `cast` where the caller passed it (weight already in dtype:
    gpt2.step.CastWeights casts once per optimizer step what every micro-step's forward would cast again), else
    weight cast here into a new tensor, which the op returns for its backward to keep rather than casting weight
    again (a custom op's output may not alias an input, as weight.to(its own dtype) does)."""
    if cast is None:
        return weight.to(dtype, copy=True)
    check_cast(weight, dtype, cast)
    return cast


def check_cast(weight: torch.Tensor, dtype: torch.dtype, cast: torch.Tensor) -> None:
    """A caller's cast must be weight's shape in the compute dtype: another matrix's cast (a list off by one), or
    one in another dtype, would otherwise reach the GEMMs, as a wrong product or a torch error naming no weight."""
    if cast.dtype != dtype or cast.shape != weight.shape:
        raise ValueError(f"cast_weight {tuple(cast.shape)} in {cast.dtype} is not this weight's cast: expected "
                         f"{tuple(weight.shape)} in {dtype} (gpt2.step.CastWeights casts GPT.matrices() in order)")


def for_backward(w: torch.Tensor, cast: torch.Tensor | None) -> torch.Tensor:
    """The op's output that its backward keeps of its compute weight w (`compute_copy`): w where the op cast it,
    an empty tensor where w is the caller's `cast`, which the backward keeps as an input (`kept_weight`)."""
    return w if cast is None else w.new_empty(0)


def fake_for_backward(weight: torch.Tensor, cast: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """`for_backward`'s output in a fake kernel (a compiled model's trace refuses a wrong cast as the op would)."""
    if cast is not None:
        check_cast(weight, dtype, cast)
    return weight.new_empty(weight.shape if cast is None else (0,), dtype=dtype)


def kept_weight(cast: torch.Tensor | None, returned: torch.Tensor) -> torch.Tensor:
    """The compute weight an op's backward multiplies with: the caller's `cast`, else the one the op returned."""
    return returned if cast is None else cast


@torch.library.custom_op("gpt2_kernels::biased_linear", mutates_args=(), tags=EXACT_STRIDES)
def _biased_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, cast_weight: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (h Wᵀ + b (N, out) in h's dtype, W in h's dtype for the backward: `for_backward`)."""
    augmented(h)  # fail here, not in backward, on an input without the column
    w = compute_copy(weight, h.dtype, cast_weight)
    return matmul(h, w.t(), bias.to(h.dtype), tile_for(C_ATTN_FORWARD, h.size(1))), for_backward(w, cast_weight)


def _fake_forward(h, weight, cast_weight):
    return h.new_empty(h.size(0), weight.size(0)), fake_for_backward(weight, cast_weight, h.dtype)


@_biased_linear.register_fake
def _(h, weight, bias, cast_weight):
    return _fake_forward(h, weight, cast_weight)


@torch.library.custom_op("gpt2_kernels::biased_linear_bwd", mutates_args=(), tags=EXACT_STRIDES)
def _biased_linear_bwd(dy: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, grad_dtype: torch.dtype
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight in the compute dtype -> (dh (N, C) in h's dtype, dW, db in grad_dtype, the parameters')."""
    dw, db = weight_and_bias_grads(dy, h, grad_dtype)
    return matmul(dy, weight.to(dy.dtype), None, tile_for(C_ATTN_INPUT_GRAD, weight.size(1))), dw, db


@_biased_linear_bwd.register_fake
def _(dy, h, weight, grad_dtype):
    return h.new_empty(h.shape), empty_weight_grad(weight, grad_dtype), weight.new_empty(weight.size(0),
                                                                                          dtype=grad_dtype)


def _register_autograd(op, backward_op) -> None:
    """op(h, weight, bias, cast_weight[, weight_grad]) -> (y, weight's cast or empty: `for_backward`): its backward
    is backward_op(dy, h, the cast, the parameters' dtype[, weight_grad]), whose gradients are op's first inputs'
    (the rest, `projection`'s bias, the cast and weight_grad, take none). Where weight_grad is given, backward_op
    adds weight's gradient into it (`weight_gradient`), and none goes back to autograd."""

    def setup_context(ctx, inputs, output):
        h, weight, _, cast_weight, *weight_grad = inputs
        ctx.save_for_backward(h, kept_weight(cast_weight, output[1]))
        # on ctx, not saved: the other parameters' gradients are views of the same buffer, and their adds move the
        # version counter all its views share, which a saved tensor's check would take for a change to this one
        ctx.weight_grad = weight_grad
        ctx.grad_dtype = weight.dtype
        ctx.n_inputs = len(inputs)
        ctx.mark_non_differentiable(output[1])

    def backward(ctx, dy, _dw):
        h, w = ctx.saved_tensors
        grads = backward_op(dy.contiguous(), h, w, ctx.grad_dtype, *ctx.weight_grad)
        if ctx.weight_grad and ctx.weight_grad[0] is not None:  # dW went into weight_grad
            grads = (grads[0], None)
        return *grads, *(None,) * (ctx.n_inputs - len(grads))

    op.register_autograd(backward, setup_context=setup_context)


_register_autograd(_biased_linear, _biased_linear_bwd)


def projection(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               cast_weight: torch.Tensor | None = None, weight_grad: torch.Tensor | None = None) -> torch.Tensor:
    """A branch's c_proj in the fused model: h (..., C) -> h Wᵀ + b (..., out) in h's dtype, the bias added to the
    GEMM's fp32 accumulator before its one rounding (in quack's epilogue), as the plain path and llm.c add it.
    The bias is a constant here (taken detached): its gradient, Σ_rows dy, is the next add_layernorm's to sum
    (its `bias_in_y`), in the pass over d(residual) = dy its backward makes anyway. Weight's gradient comes in
    weight's dtype, out of the GEMM's fp32 accumulator; `cast_weight` as for `biased_linear`. With `weight_grad`
    (weight's shape and dtype: the gradient buffer's view), the backward's GEMM adds weight's gradient into it and
    autograd gets none for weight."""
    C = h.size(-1)
    y = _projection(h.reshape(-1, C), weight, bias.detach(), cast_weight, weight_grad)[0]
    return y.view(*h.shape[:-1], weight.size(0))


@torch.library.custom_op("gpt2_kernels::projection", mutates_args=())
def _projection(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, cast_weight: torch.Tensor | None,
                weight_grad: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (h Wᵀ + b (N, out) in h's dtype, W in h's dtype for the backward: `for_backward`). weight_grad is the
    backward's (`projection`)."""
    w = compute_copy(weight, h.dtype, cast_weight)
    return matmul(h, w.t(), bias.to(h.dtype), tile_for(ATTN_PROJ, h.size(1))), for_backward(w, cast_weight)


@_projection.register_fake
def _(h, weight, bias, cast_weight, weight_grad):
    return _fake_forward(h, weight, cast_weight)


@torch.library.custom_op("gpt2_kernels::projection_bwd", mutates_args=("weight_grad",))
def _projection_bwd(dy: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, grad_dtype: torch.dtype,
                    weight_grad: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """weight in the compute dtype -> (dh (N, C) in h's dtype, dW in grad_dtype, the parameter's, or with weight_grad
    dW added into it and an empty tensor: `weight_gradient`)."""
    return (matmul(dy, weight.to(dy.dtype), None, tile_for(ATTN_PROJ, weight.size(1))),
            weight_gradient(dy, h, grad_dtype, weight_grad))


@_projection_bwd.register_fake
def _(dy, h, weight, grad_dtype, weight_grad):
    return h.new_empty(h.shape), fake_weight_gradient(weight, grad_dtype, weight_grad)


_register_autograd(_projection, _projection_bwd)
