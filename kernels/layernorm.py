"""Fused residual add + LayerNorm, forward and backward (llm.c's fused_residual_forward + layernorm).

    residual = x + y                     (fp32 residual stream; y is the branch output, often bf16)
    out      = (residual - mean) * rstd * weight + bias   (in the activation dtype, e.g. bf16)

One pass over the row in forward, which saves only `residual` (needed anyway as the next block's
input) and per-row mean/rstd. Backward reads the residual, the incoming gradient of `out` and of
`residual`, and writes d(residual) once in each input's dtype; weight/bias gradients are summed per
program in fp32 and reduced once at the end. `y=None` is a plain LayerNorm (the first block's ln_1).

`add_layernorm` is the entry point; `add_layernorm_reference` is the plain formula.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._triton import jit, next_power_of_2, num_sms, tl, use_triton


@jit
def _add_layernorm_fwd_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr,  # x, y (N, C); w, b (C,)
    res_ptr, out_ptr, mean_ptr, rstd_ptr,  # residual (N, C), out (N, C), mean and rstd (N,) fp32
    eps,
    C: tl.constexpr,
    HAS_Y: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    mask = cols < C
    offs = row * C + cols
    z = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_Y:
        z += tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(res_ptr + offs, z.to(res_ptr.dtype.element_ty), mask=mask)
    mean = tl.sum(z, axis=0) / C
    d = tl.where(mask, z - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / C + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (d * rstd * w + b).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@jit
def _add_layernorm_bwd_kernel(
    res_ptr, w_ptr, mean_ptr, rstd_ptr,  # saved by forward
    dout_ptr, dres_ptr,  # incoming gradients of out and of residual (N, C)
    dx_ptr, dy_ptr,  # gradients of x and y (N, C), each in its input's dtype
    dw_partial_ptr, db_partial_ptr,  # (n_programs, C) fp32 per-program sums
    n_rows,
    C: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    HAS_DRES: tl.constexpr,
    HAS_Y: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < C
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_C], dtype=tl.float32)
    db = tl.zeros([BLOCK_C], dtype=tl.float32)
    for i in range(ROWS_PER_PROGRAM):
        row = pid.to(tl.int64) * ROWS_PER_PROGRAM + i
        mask = col_mask & (row < n_rows)
        offs = row * C + cols
        z = tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dout = tl.load(dout_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row, mask=row < n_rows, other=0.0)
        rstd = tl.load(rstd_ptr + row, mask=row < n_rows, other=0.0)
        xhat = tl.where(mask, (z - mean) * rstd, 0.0)
        wdout = w * dout
        # d xhat-space: dz = rstd * (w*dout - mean(w*dout) - xhat * mean(w*dout*xhat))
        dz = rstd * (wdout - tl.sum(wdout, axis=0) / C - xhat * (tl.sum(wdout * xhat, axis=0) / C))
        if HAS_DRES:
            dz += tl.load(dres_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + offs, dz.to(dx_ptr.dtype.element_ty), mask=mask)
        if HAS_Y:
            tl.store(dy_ptr + offs, dz.to(dy_ptr.dtype.element_ty), mask=mask)
        dw += dout * xhat
        db += dout
    tl.store(dw_partial_ptr + pid * C + cols, dw, mask=col_mask)
    tl.store(db_partial_ptr + pid * C + cols, db, mask=col_mask)


@torch.library.custom_op("gpt2_kernels::add_layernorm_fwd", mutates_args=())
def _add_layernorm_fwd(
    x: torch.Tensor,  # (N, C)
    y: torch.Tensor | None,  # (N, C) or None
    weight: torch.Tensor,  # (C,)
    bias: torch.Tensor,  # (C,)
    eps: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (residual (N, C) in x's dtype, out (N, C) out_dtype, mean (N,) fp32, rstd (N,) fp32)."""
    N, C = x.shape
    x, y = x.contiguous(), y.contiguous() if y is not None else None  # the kernels index rows as row * C
    if not use_triton(x):
        residual = (x + y).to(x.dtype) if y is not None else x.clone()
        z = residual.float()
        var, mean = torch.var_mean(z, dim=1, unbiased=False)
        rstd = torch.rsqrt(var + eps)
        out = F.layer_norm(z, (C,), weight.float(), bias.float(), eps).to(out_dtype)
        return residual, out, mean, rstd
    residual = torch.empty_like(x) if y is not None else x.clone()  # outputs may not alias inputs
    out = torch.empty(N, C, dtype=out_dtype, device=x.device)
    mean = torch.empty(N, dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    _add_layernorm_fwd_kernel[(N,)](
        x, y if y is not None else x, weight, bias, residual, out, mean, rstd, eps,
        C=C, HAS_Y=y is not None, BLOCK_C=next_power_of_2(C), num_warps=4,
    )
    return residual, out, mean, rstd


@_add_layernorm_fwd.register_fake
def _(x, y, weight, bias, eps, out_dtype):
    N, C = x.shape
    mean = x.new_empty(N, dtype=torch.float32)
    return torch.empty_like(x), x.new_empty(N, C, dtype=out_dtype), mean, torch.empty_like(mean)


@torch.library.custom_op("gpt2_kernels::add_layernorm_bwd", mutates_args=())
def _add_layernorm_bwd(
    residual: torch.Tensor,
    weight: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    dout: torch.Tensor,
    dres: torch.Tensor | None,
    y_dtype: torch.dtype | None,  # None: forward had no y
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dx in residual's dtype, dy in y_dtype (empty without y), dweight, dbias in weight's dtype)."""
    N, C = residual.shape
    dout, dres = dout.contiguous(), dres.contiguous() if dres is not None else None
    if not use_triton(residual):
        xhat = (residual.float() - mean[:, None]) * rstd[:, None]  # (N, C)
        g = dout.float()
        wg = g * weight.float()
        dz = rstd[:, None] * (wg - wg.mean(1, keepdim=True) - xhat * (wg * xhat).mean(1, keepdim=True))
        if dres is not None:
            dz = dz + dres.float()
        # copies: a custom op's outputs may not alias each other even when the dtypes agree
        dy = dz.to(y_dtype, copy=True) if y_dtype is not None else residual.new_empty(0)
        dw, db = (g * xhat).sum(0), g.sum(0)
        return dz.to(residual.dtype), dy, dw.to(weight.dtype), db.to(weight.dtype)
    n_programs = min(N, 8 * num_sms(residual.device))  # enough rows in flight per SM to hide latency
    rows_per_program = -(-N // n_programs)
    n_programs = -(-N // rows_per_program)
    dx = torch.empty_like(residual)
    dy = torch.empty(N, C, dtype=y_dtype, device=residual.device) if y_dtype is not None else dx.new_empty(0)
    dw_partial = torch.empty(n_programs, C, dtype=torch.float32, device=residual.device)
    db_partial = torch.empty_like(dw_partial)
    _add_layernorm_bwd_kernel[(n_programs,)](
        residual, weight, mean, rstd, dout, dres if dres is not None else dout, dx, dy if y_dtype is not None else dx,
        dw_partial, db_partial, N,
        C=C, ROWS_PER_PROGRAM=rows_per_program, HAS_DRES=dres is not None, HAS_Y=y_dtype is not None,
        BLOCK_C=next_power_of_2(C), num_warps=4,
    )
    return dx, dy, dw_partial.sum(0).to(weight.dtype), db_partial.sum(0).to(weight.dtype)


@_add_layernorm_bwd.register_fake
def _(residual, weight, mean, rstd, dout, dres, y_dtype):
    N, C = residual.shape
    dy = residual.new_empty(N, C, dtype=y_dtype) if y_dtype is not None else residual.new_empty(0)
    return torch.empty_like(residual), dy, torch.empty_like(weight), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    _, y, weight, _, _, _ = inputs
    residual, _, mean, rstd = output
    ctx.save_for_backward(residual, weight, mean, rstd)
    ctx.y_dtype = y.dtype if y is not None else None
    ctx.mark_non_differentiable(mean, rstd)


def _backward(ctx, dres, dout, _dmean, _drstd):
    residual, weight, mean, rstd = ctx.saved_tensors
    dx, dy, dw, db = _add_layernorm_bwd(residual, weight, mean, rstd, dout, dres, ctx.y_dtype)
    return dx, (dy if ctx.y_dtype is not None else None), dw, db, None, None


_add_layernorm_fwd.register_autograd(_backward, setup_context=_setup_context)


def add_layernorm(
    x: torch.Tensor,
    y: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + y, LayerNorm(x + y)) over the last dim; y=None normalises x alone (residual is then a copy).

    x (..., C) is the residual stream (its dtype is kept for the sum); `out_dtype` (default x's) is the
    dtype of the normalised output, e.g. bf16 under autocast, which custom ops do not see.
    """
    C = x.size(-1)
    if weight.shape != (C,) or bias.shape != (C,):
        raise ValueError(f"weight and bias must be ({C},), got {tuple(weight.shape)} and {tuple(bias.shape)}")
    if y is not None and y.shape != x.shape:
        raise ValueError(f"y shape {tuple(y.shape)} must equal x shape {tuple(x.shape)}")
    y2 = y.reshape(-1, C) if y is not None else None  # (N, C)
    residual, out, _, _ = _add_layernorm_fwd(x.reshape(-1, C), y2, weight, bias, eps, out_dtype or x.dtype)
    return residual.view(x.shape), out.view(x.shape)


def add_layernorm_reference(
    x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain formula (autograd through torch ops), computed in x's dtype."""
    residual = x + y if y is not None else x
    return residual, F.layer_norm(residual, (x.size(-1),), weight, bias, eps)
