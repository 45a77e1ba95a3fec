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

`biased_linear` is c_attn's op; kernels/mlp.py takes c_fc's bias gradient the same way
(`weight_and_bias_grads`). `with_ones_column` gives any (..., C) tensor the layout (a copy), for callers
that do not get h from add_layernorm.
"""

from __future__ import annotations

import torch

ONES_COLUMNS = 8  # the column of ones, then zeros: C + 8 columns keep a bf16 row a multiple of 16 bytes
_ROW_ALIGN = 64  # elements: 128 bytes in bf16
# The ops that read the column past h's last take h with the strides it came with: no compiler copy into a
# dense layout, which would drop the column (an op finding h without it raises rather than reading past it)
EXACT_STRIDES = tuple(t for t in (getattr(torch.Tag, "needs_exact_strides", None),) if t is not None)


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
    """h (..., C) copied (and cast to dtype) into the layout that `biased_linear` and `kernels.fused_mlp` read."""
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
                         "output of add_layernorm(..., ones_column=True) or kernels.linear.with_ones_column(h)")
    return h.as_strided((N, width), (row_stride, 1))


def weight_and_bias_grads(dy: torch.Tensor, h: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(dW (out, C), db (out,)) in dtype of a linear layer y = h Wᵀ + b, from dy (N, out) and h (N, C) in
    the ones-column layout: one GEMM, dyᵀ [h | 1], its fp32 accumulator written in dtype (fp32 in training)."""
    C = h.size(1)
    dwb = matmul_out(dy.t(), augmented(h), dtype)  # (out, C + 8): dW, db, then zeros
    return dwb[:, :C], dwb[:, C]


def matmul_out(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a @ b in dtype, never rounded to a's dtype first: on CUDA a bf16 product comes out of the matmul's
    fp32 accumulator as fp32 itself (no separate cast pass); CPU has no such kernel and multiplies the
    same values in dtype, as kernels.cross_entropy.accumulate_dw does."""
    if a.is_cuda and dtype == torch.float32 and a.dtype != dtype:
        return torch.mm(a, b, out_dtype=dtype)
    return a.to(dtype) @ b.to(dtype)


def biased_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """h (..., C) in the ones-column layout -> h Wᵀ + b (..., out) in h's dtype (the weights are cast to it,
    as autocast would: custom ops do not see autocast); the gradients of weight and bias come from one
    GEMM in weight's dtype."""
    C = h.size(-1)
    return _biased_linear(h.reshape(-1, C), weight, bias).view(*h.shape[:-1], weight.size(0))


@torch.library.custom_op("gpt2_kernels::biased_linear", mutates_args=(), tags=EXACT_STRIDES)
def _biased_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    augmented(h)  # fail here, not in backward, on an input without the column
    return torch.addmm(bias.to(h.dtype), h, weight.to(h.dtype).t())


@_biased_linear.register_fake
def _(h, weight, bias):
    return h.new_empty(h.size(0), weight.size(0))


@torch.library.custom_op("gpt2_kernels::biased_linear_bwd", mutates_args=(), tags=EXACT_STRIDES)
def _biased_linear_bwd(dy: torch.Tensor, h: torch.Tensor, weight: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dh (N, C) in h's dtype, dW, db in weight's dtype)."""
    dw, db = weight_and_bias_grads(dy, h, weight.dtype)
    # copies: a custom op's outputs may not alias each other (dW and db are views of one product)
    return dy @ weight.to(dy.dtype), dw.contiguous(), db.clone()


@_biased_linear_bwd.register_fake
def _(dy, h, weight):
    return h.new_empty(h.shape), weight.new_empty(weight.shape), weight.new_empty(weight.size(0))


def _setup_context(ctx, inputs, output):
    h, weight, _ = inputs
    ctx.save_for_backward(h, weight)


def _backward(ctx, dy):
    h, weight = ctx.saved_tensors
    dh, dw, db = _biased_linear_bwd(dy.contiguous(), h, weight)
    return dh, dw, db


_biased_linear.register_autograd(_backward, setup_context=_setup_context)
