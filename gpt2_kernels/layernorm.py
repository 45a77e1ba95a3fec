"""Fused residual add + LayerNorm, forward and backward (llm.c's fused_residual_forward + layernorm).

    residual = x + y                     (in x's dtype: the residual stream; y is the branch output)
    out      = (residual - mean) * rstd * weight + bias   (in the activation dtype, e.g. bf16)

`bias_in_y` is the bias that the matmul which produced y (the c_proj of a block's branch) added in its
epilogue: its gradient, the column sum of d(residual), comes out of this op's backward, which walks
d(residual) anyway, instead of a separate column-sum pass. The bias is added there, not here: rounded
into the residual here, a bias far below the residual's ulp (a c_proj bias after its first updates)
would settle every exact tie of the bf16 sum x + y its way (docs/benchmarks.md).

One pass over the row in forward, which writes the residual and the normalised row. Backward
recomputes xhat from the residual in out's dtype, as llm.c does from its bf16 residual stream:
- x in out's dtype (the fused model's layout: a bf16 residual stream under bf16 autocast, as llm.c
  keeps it): the residual output itself is saved, nothing else is written. 8 bytes per element in
  bf16: read x, y, write residual, out.
- x in another dtype (an fp32 stream with bf16 outputs): forward also writes the residual rounded
  to out's dtype for backward, so the fp32 residual is freed once the next add has read it.
Backward reads the saved residual and the incoming gradients of `out` and of `residual` and writes
d(residual) once: x and y get the same gradient tensor when their dtypes agree (8 bytes per element
in bf16: read residual, dout, dres, write the gradient), else a second copy in y's dtype. The
gradients of weight, bias and bias_in_y are summed per program in fp32 and reduced once at the end;
the launch shape (rows per iteration, warps) is a function of C alone (`bwd_launch_shape`), never
timed per process: the shape sets the order of those sums, and a run resumed in another process must
sum as the uninterrupted one did. `y=None` is a plain LayerNorm (the first block's ln_1).

`add_layernorm` is the entry point; `add_layernorm_reference` is the plain formula.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpt2_kernels._triton import jit, next_power_of_2, num_sms, tl, use_triton
from gpt2_kernels.linear import ONES_COLUMNS, empty_with_ones_column, padded_width


@jit
def _add_layernorm_fwd_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr,  # x, y (N, C); w, b (C,)
    res_ptr, out_ptr, copy_ptr,  # residual, out, and (WRITE_COPY) the residual in out's dtype (N, C)
    mean_ptr, rstd_ptr,  # (N,) fp32
    eps,
    out_row_stride,  # C, or with ONES_COLUMN the padded row (gpt2_kernels.linear.padded_width)
    C: tl.constexpr,
    HAS_Y: tl.constexpr,
    WRITE_COPY: tl.constexpr,
    ONES_COLUMN: tl.constexpr,  # out's row continues with a one and then zeros (gpt2_kernels/linear.py)
    N_ONES_COLUMNS: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    mask = cols < C
    offs = row * C + cols
    z = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_Y:
        z += tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # normalise the residual as stored (rounded to a bf16 stream's dtype): backward recomputes from it
    z = z.to(res_ptr.dtype.element_ty)
    tl.store(res_ptr + offs, z, mask=mask)
    z = z.to(tl.float32)
    if WRITE_COPY:
        tl.store(copy_ptr + offs, z.to(copy_ptr.dtype.element_ty), mask=mask)
    mean = tl.sum(z, axis=0) / C
    d = tl.where(mask, z - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / C + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out_row = out_ptr + row * out_row_stride
    tl.store(out_row + cols, (d * rstd * w + b).to(out_ptr.dtype.element_ty), mask=mask)
    if ONES_COLUMN:
        pad = tl.arange(0, N_ONES_COLUMNS)
        tl.store(out_row + C + pad, tl.where(pad == 0, 1.0, 0.0).to(out_ptr.dtype.element_ty))
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@jit
def _bwd_rows(first_row, i, n_rows, r, cols, col_mask, C: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr):
    """Rows first_row + i + r of a program's rows: (rows, row_mask, mask, offs); masked off past the
    program's or the tensor's end."""
    rows = first_row + i + r  # (BLOCK_R,)
    row_mask = (i + r < ROWS_PER_PROGRAM) & (rows < n_rows)
    mask = row_mask[:, None] & col_mask[None, :]  # (BLOCK_R, BLOCK_C)
    return rows, row_mask, mask, rows[:, None] * C + cols[None, :]


@jit
def _bwd_load_rows(z_ptr, dout_ptr, dres_ptr, mean_ptr, rstd_ptr, first_row, i, n_rows, r, cols, col_mask,
                   C: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, HAS_DRES: tl.constexpr):
    """The backward's inputs for `_bwd_rows`' rows, in their stored dtypes: z, dout, dres (BLOCK_R, BLOCK_C)
    (z again without HAS_DRES), mean and rstd (BLOCK_R, 1); masked-off rows read as zeros."""
    rows, row_mask, mask, offs = _bwd_rows(first_row, i, n_rows, r, cols, col_mask, C, ROWS_PER_PROGRAM)
    z = tl.load(z_ptr + offs, mask=mask, other=0.0)
    dout = tl.load(dout_ptr + offs, mask=mask, other=0.0)
    dres = tl.load(dres_ptr + offs, mask=mask, other=0.0) if HAS_DRES else z
    mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)[:, None]
    rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)[:, None]
    return z, dout, dres, mean, rstd


@jit
def _add_layernorm_bwd_kernel(
    z_ptr, w_ptr, mean_ptr, rstd_ptr,  # saved by forward: the residual (N, C) in any dtype, w (C,), (N,)
    dout_ptr, dres_ptr,  # incoming gradients of out and of residual (N, C)
    dx_ptr, dy_ptr,  # d(residual) (N, C) in x's dtype, and (WRITE_DY) again in y's
    partial_ptr,  # (2 + HAS_BIAS_IN_Y, n_programs, C) fp32: per-program sums of the weight, bias, bias_in_y gradients
    n_rows,
    C: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    HAS_DRES: tl.constexpr,
    WRITE_DY: tl.constexpr,
    HAS_BIAS_IN_Y: tl.constexpr,
    BLOCK_R: tl.constexpr,  # rows per iteration: more bytes in flight per program
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < C
    r = tl.arange(0, BLOCK_R)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]  # (1, BLOCK_C)
    dw = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    db = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    dbias_in_y = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    # Each iteration's loads are issued one iteration ahead (software prefetch): with one warp a program and a
    # few programs an SM, a warp would otherwise have nothing in flight while it reduces and stores its rows
    # (d12, H100: 170 -> 151 us, the same sums in the same order)
    first_row = pid.to(tl.int64) * ROWS_PER_PROGRAM
    z_next, dout_next, dres_next, mean_next, rstd_next = _bwd_load_rows(
        z_ptr, dout_ptr, dres_ptr, mean_ptr, rstd_ptr, first_row, 0, n_rows, r, cols, col_mask,
        C, ROWS_PER_PROGRAM, HAS_DRES)
    for i in range(0, ROWS_PER_PROGRAM, BLOCK_R):
        z, dout, dres, mean, rstd = z_next, dout_next, dres_next, mean_next, rstd_next
        z_next, dout_next, dres_next, mean_next, rstd_next = _bwd_load_rows(
            z_ptr, dout_ptr, dres_ptr, mean_ptr, rstd_ptr, first_row, i + BLOCK_R, n_rows, r, cols, col_mask,
            C, ROWS_PER_PROGRAM, HAS_DRES)
        _, _, mask, offs = _bwd_rows(first_row, i, n_rows, r, cols, col_mask, C, ROWS_PER_PROGRAM)
        z, dout = z.to(tl.float32), dout.to(tl.float32)
        xhat = tl.where(mask, (z - mean) * rstd, 0.0)
        wdout = w * dout
        # dz = rstd * (w*dout - mean(w*dout) - xhat * mean(w*dout*xhat)), means over the row
        c1 = tl.sum(wdout, axis=1)[:, None] / C
        c2 = tl.sum(wdout * xhat, axis=1)[:, None] / C
        dz = rstd * (wdout - c1 - xhat * c2)
        if HAS_DRES:
            dz += dres.to(tl.float32)
        tl.store(dx_ptr + offs, dz.to(dx_ptr.dtype.element_ty), mask=mask)
        if WRITE_DY:
            tl.store(dy_ptr + offs, dz.to(dy_ptr.dtype.element_ty), mask=mask)
        dw += dout * xhat
        db += dout
        if HAS_BIAS_IN_Y:
            dbias_in_y += dz  # bias_in_y is in every row of y: its gradient is d(residual)'s column sum
    n_programs = tl.num_programs(0)
    tl.store(partial_ptr + pid * C + cols, tl.sum(dw, axis=0), mask=col_mask)
    tl.store(partial_ptr + (n_programs + pid) * C + cols, tl.sum(db, axis=0), mask=col_mask)
    if HAS_BIAS_IN_Y:
        tl.store(partial_ptr + (2 * n_programs + pid) * C + cols, tl.sum(dbias_in_y, axis=0), mask=col_mask)


# Backward launch shapes the tests and bench_kernels.py's sweep run. At d12's training shapes on an H100
# (2026-11-24) one warp per program was fastest: 181 us for 1 row x 1 warp, 189 for 2 x 1, against 206 for
# 2 x 4 (a row within one warp needs no shared-memory round trip for its two sums); on an H200, 2 x 4 beat
# the 4- and 8-warp shapes (0.22 ms against 0.28, 0.31 and 0.46; docs/benchmarks.md).
_BWD_CONFIGS = [
    dict(BLOCK_R=1, num_warps=1),
    dict(BLOCK_R=2, num_warps=1),
    dict(BLOCK_R=1, num_warps=2),  # bwd_launch_shape's for 1,281 to 2,560 columns (d48)
    dict(BLOCK_R=1, num_warps=4),
    dict(BLOCK_R=2, num_warps=4),
    dict(BLOCK_R=2, num_warps=8),
    dict(BLOCK_R=4, num_warps=8),
]
# Columns a warp takes in the backward. The sweep on an H200 (2026-11-26, 65,536 rows): one row of one warp
# was fastest at 768, 1,024 and 1,280 columns (145, 171, 211 us; the next best 155, 189, 276), two warps at
# 1,600 (308 us against 515 for one). Both sweeps predate the kernel's prefetch (only d12's shape measured since)
_BWD_COLUMNS_PER_WARP = 1280


def bwd_launch_shape(C: int) -> dict:
    """The backward's launch shape for rows of C columns: one row per iteration, a warp per 1,280 columns.
    Fixed rather than autotuned, since the shape decides the order in which the weight, bias and c_proj-bias
    gradients and each row's two means are summed: an autotuner times the shapes afresh in every process
    and may pick another in a resumed run, or on another rank, than in the first."""
    return dict(BLOCK_R=1, num_warps=next_power_of_2(-(-C // _BWD_COLUMNS_PER_WARP)))


_BWD_PROGRAMS_PER_SM = 8  # persistent grid: few enough programs that their partial sums stay small


def _bwd_grid(n_rows: int, device: torch.device) -> tuple[int, int]:
    """(programs, rows per program) of the backward's persistent grid: every program but the last
    gets the same number of rows, and no program is left without any."""
    n_programs = min(n_rows, _BWD_PROGRAMS_PER_SM * num_sms(device))
    rows_per_program = -(-n_rows // n_programs)
    return -(-n_rows // rows_per_program), rows_per_program


def _writes_copy(x_dtype: torch.dtype, out_dtype: torch.dtype) -> bool:
    """Whether forward writes the residual again in out's dtype for backward: only when the residual
    stream has another dtype; otherwise backward reads the residual output itself."""
    return x_dtype != out_dtype


def _writes_dy(x_dtype: torch.dtype, y_dtype: torch.dtype | None) -> bool:
    """Whether backward writes y's gradient as a tensor of its own: only when y's dtype differs from
    x's; otherwise x and y get the one d(residual) tensor."""
    return y_dtype is not None and y_dtype != x_dtype


@torch.library.custom_op("gpt2_kernels::add_layernorm_fwd", mutates_args=())
def _add_layernorm_fwd(
    x: torch.Tensor,  # (N, C)
    y: torch.Tensor | None,  # (N, C) or None
    bias_in_y: torch.Tensor | None,  # (C,) or None (only with y): already in y, here for its gradient
    weight: torch.Tensor,  # (C,)
    bias: torch.Tensor,  # (C,)
    eps: float,
    out_dtype: torch.dtype,
    ones_column: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (residual (N, C) in x's dtype, out (N, C) out_dtype, copy, mean (N,) fp32, rstd (N,) fp32).

    With `ones_column`, out's rows lie in wider rows that continue with a column of ones
    (gpt2_kernels/linear.py), for the biased linear layer that reads out.

    `copy` is the residual rounded to out_dtype when x's dtype differs (what backward then reads),
    else empty: backward reads the residual itself (a custom op's outputs may not alias, so the
    residual cannot be returned twice).
    """
    N, C = x.shape
    x, y = x.contiguous(), y.contiguous() if y is not None else None  # the kernels index rows as row * C
    write_copy = _writes_copy(x.dtype, out_dtype)
    if not use_triton(x):  # the reference's own op (torch.native_layer_norm is what F.layer_norm runs)
        # a new tensor even without y: outputs may not alias inputs
        residual = (x.float() + (0.0 if y is None else y.float())).to(x.dtype)
        out, mean, rstd = torch.native_layer_norm(residual.float(), (C,), weight.float(), bias.float(), eps)
        copy = residual.to(out_dtype) if write_copy else x.new_empty(0)
        if ones_column:
            out = empty_with_ones_column(N, C, out_dtype, x.device).copy_(out)
        return residual, out.to(out_dtype), copy, mean.view(N), rstd.view(N)
    residual = torch.empty_like(x)
    out_row_stride = padded_width(C) if ones_column else C
    out = torch.empty(N, out_row_stride, dtype=out_dtype, device=x.device)[:, :C]
    copy = torch.empty_like(out) if write_copy else x.new_empty(0)
    mean = torch.empty(N, dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    _add_layernorm_fwd_kernel[(N,)](
        x, y if y is not None else x, weight, bias,
        residual, out, copy if write_copy else out, mean, rstd, eps, out_row_stride,
        C=C, HAS_Y=y is not None, WRITE_COPY=write_copy,
        ONES_COLUMN=ones_column, N_ONES_COLUMNS=ONES_COLUMNS, BLOCK_C=next_power_of_2(C), num_warps=4,
    )
    return residual, out, copy, mean, rstd


@_add_layernorm_fwd.register_fake
def _(x, y, bias_in_y, weight, bias, eps, out_dtype, ones_column):
    N, C = x.shape
    out = x.new_empty_strided((N, C), (padded_width(C) if ones_column else C, 1), dtype=out_dtype)
    copy = torch.empty_like(out) if _writes_copy(x.dtype, out_dtype) else x.new_empty(0)
    mean = x.new_empty(N, dtype=torch.float32)
    return torch.empty_like(x), out, copy, mean, torch.empty_like(mean)


@torch.library.custom_op("gpt2_kernels::add_layernorm_bwd", mutates_args=())
def _add_layernorm_bwd(
    z: torch.Tensor,  # (N, C) the residual as saved by forward
    weight: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    dout: torch.Tensor,
    dres: torch.Tensor | None,
    x_dtype: torch.dtype,
    y_dtype: torch.dtype | None,  # None: forward had no y
    has_bias_in_y: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dx in x_dtype, dy in y_dtype or empty (see `_writes_dy`), the gradients of weight, bias
    and (has_bias_in_y) the bias in y stacked (2 or 3, C) in weight's dtype)."""
    return add_layernorm_backward(z, weight, mean, rstd, dout, dres, x_dtype, y_dtype, has_bias_in_y)


def add_layernorm_backward(
    z: torch.Tensor,
    weight: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    dout: torch.Tensor,
    dres: torch.Tensor | None,
    x_dtype: torch.dtype,
    y_dtype: torch.dtype | None,
    has_bias_in_y: bool = False,
    config: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward op's launcher; `config` (e.g. one of _BWD_CONFIGS) overrides the launch shape
    `bwd_launch_shape(C)` (the sweep and the tests run every shape)."""
    N, C = z.shape
    dout, dres = dout.contiguous(), dres.contiguous() if dres is not None else None
    write_dy = _writes_dy(x_dtype, y_dtype)
    if not use_triton(z):  # the reference's own backward op, the one autograd runs for F.layer_norm
        dz, dw, db = torch.ops.aten.native_layer_norm_backward(
            dout.float(), z.float(), (C,), mean.view(N, 1), rstd.view(N, 1), weight.float(), torch.zeros_like(weight, dtype=torch.float32),
            [True, True, True])
        if dres is not None:
            dz = dz + dres.float()
        dparams = [dw, db] + ([dz.sum(0)] if has_bias_in_y else [])
        # copies: a custom op's outputs may not alias each other (or its inputs) even when dtypes agree
        dy = dz.to(y_dtype, copy=True) if write_dy else z.new_empty(0)
        return dz.to(x_dtype, copy=True), dy, torch.stack(dparams).to(weight.dtype)
    n_programs, rows_per_program = _bwd_grid(N, z.device)
    dx = torch.empty(N, C, dtype=x_dtype, device=z.device)
    dy = torch.empty(N, C, dtype=y_dtype, device=z.device) if write_dy else dx.new_empty(0)
    partial = torch.empty(2 + has_bias_in_y, n_programs, C, dtype=torch.float32, device=z.device)
    args = (z, weight, mean, rstd, dout, dres if dres is not None else dout, dx, dy if write_dy else dx, partial, N)
    meta = dict(C=C, ROWS_PER_PROGRAM=rows_per_program, HAS_DRES=dres is not None, WRITE_DY=write_dy,
                HAS_BIAS_IN_Y=has_bias_in_y, BLOCK_C=next_power_of_2(C))
    _add_layernorm_bwd_kernel[(n_programs,)](*args, **meta, **(config or bwd_launch_shape(C)))
    return dx, dy, partial.sum(1).to(weight.dtype)  # one reduction for all


@_add_layernorm_bwd.register_fake
def _(z, weight, mean, rstd, dout, dres, x_dtype, y_dtype, has_bias_in_y):
    N, C = z.shape
    dy = z.new_empty(N, C, dtype=y_dtype) if _writes_dy(x_dtype, y_dtype) else z.new_empty(0)
    return z.new_empty(N, C, dtype=x_dtype), dy, weight.new_empty(2 + has_bias_in_y, C)


def _setup_context(ctx, inputs, output):
    x, y, bias_in_y, weight, _, _, out_dtype, _ = inputs
    residual, _, copy, mean, rstd = output
    # the residual in out's dtype: with a bf16 copy, the fp32 residual is freed once the next add has read it
    ctx.save_for_backward(copy if _writes_copy(x.dtype, out_dtype) else residual, weight, mean, rstd)
    ctx.x_dtype = x.dtype
    ctx.y_dtype = y.dtype if y is not None else None
    ctx.bias_in_y_dtype = bias_in_y.dtype if bias_in_y is not None else None
    ctx.mark_non_differentiable(copy, mean, rstd)


def _backward(ctx, dres, dout, _dcopy, _dmean, _drstd):
    z, weight, mean, rstd = ctx.saved_tensors
    has_bias_in_y = ctx.bias_in_y_dtype is not None
    dx, dy, dparams = _add_layernorm_bwd(z, weight, mean, rstd, dout, dres, ctx.x_dtype, ctx.y_dtype, has_bias_in_y)
    if ctx.y_dtype is None:
        dy = None
    elif not _writes_dy(ctx.x_dtype, ctx.y_dtype):
        dy = dx  # d(x + y) is one tensor for both (autograd formulas, unlike ops, may return it twice)
    d_bias_in_y = dparams[2].to(ctx.bias_in_y_dtype) if has_bias_in_y else None
    return dx, dy, d_bias_in_y, dparams[0], dparams[1], None, None, None


_add_layernorm_fwd.register_autograd(_backward, setup_context=_setup_context)


def add_layernorm(
    x: torch.Tensor,
    y: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    out_dtype: torch.dtype | None = None,
    bias_in_y: torch.Tensor | None = None,
    ones_column: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + y, LayerNorm of it) over the last dim; y=None normalises x alone (the residual is then a
    copy).

    x (..., C) is the residual stream, whose dtype the sum keeps (fp32, or bf16 as the fused model
    runs it); `out_dtype` (default x's) is the dtype of the normalised output, e.g. bf16 under
    autocast, which custom ops do not see. `bias_in_y` (C,) is the bias that the matmul which made y
    has added, taken there as a constant (gpt2_kernels.linear.projection, gpt2_kernels.fused_mlp): this op does not
    add it again, and its backward returns the bias's gradient, Σ_rows dy. `ones_column` lays the
    normalised output out for a biased linear layer of gpt2_kernels/linear.py to read, which then takes its bias
    gradient from its weight-gradient GEMM.
    """
    C = x.size(-1)
    if weight.shape != (C,) or bias.shape != (C,):
        raise ValueError(f"weight and bias must be ({C},), got {tuple(weight.shape)} and {tuple(bias.shape)}")
    if y is not None and y.shape != x.shape:
        raise ValueError(f"y shape {tuple(y.shape)} must equal x shape {tuple(x.shape)}")
    if bias_in_y is not None and (y is None or bias_in_y.shape != (C,)):
        raise ValueError(f"bias_in_y must be ({C},) and come with y, got {tuple(bias_in_y.shape)} with y "
                         f"{'None' if y is None else tuple(y.shape)}")
    y2 = y.reshape(-1, C) if y is not None else None  # (N, C)
    residual, out, _, _, _ = _add_layernorm_fwd(x.reshape(-1, C), y2, bias_in_y, weight, bias, eps,
                                                out_dtype or x.dtype, ones_column)
    return residual.view(x.shape), out.view(x.shape)


def add_layernorm_reference(
    x: torch.Tensor,
    y: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    bias_in_y: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain formula (autograd through torch ops), the residual in x's dtype. bias_in_y, already in y,
    enters as a zero whose gradient is the bias's."""
    branch = y + (bias_in_y - bias_in_y.detach()) if y is not None and bias_in_y is not None else y
    residual = (x + branch).to(x.dtype) if y is not None else x
    return residual, F.layer_norm(residual, (x.size(-1),), weight, bias, eps)
