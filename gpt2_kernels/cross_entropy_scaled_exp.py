"""The classifier's chunk loop on Hopper through quack's scaled-exp GEMMs (the `gpu` extra).

gpt2_kernels/cross_entropy.py's Triton path runs four kernels per chunk of rows: the logits GEMM, a softmax
pass that reads each logit twice and writes dlogits over it, then the dx and dW GEMMs. Here the softmax
pass is gone: the logits GEMM's epilogue writes, in place of the logits,

    E = 2^(z·log2e − k)   bf16, k = round(max of the row's logits in this 128-column tile · log2e)

together with, per (row, tile), k and Σ E, and per row the target's raw logit z_y. From these, a small
glue kernel (quack's `lce_glue`) gives each row's lse and loss, fixes E at the target column, and writes
u = 2^(k − k_row) per (row, 64 columns), v = grad_scale · 2^k_row · e^−lse per row and xs = v · x. Then
dlogits = v · u · E, and the gradient GEMMs scale E on the fly (u in registers as they load it, v in the
epilogue or inside xs):

    dx_c  = v ∘ ((u ∘ E) @ W)                 (rows, C), the chunk's rows of dx
    dW   += (u ∘ E)ᵀ @ xs                     (Vp, C) fp32, accumulated by the store itself

Per d12 chunk of 16,384 rows that is one bf16 write of E where the Triton path wrote the logits, read
them twice and wrote dlogits. u and v are powers of two or fp32 and E has bf16's relative precision, so
dlogits keep the precision they have as bf16 values.

Padded vocabulary columns (vocab_size..Vp) get −16384 added (a row vector in the epilogue) before both
the max and the exp, so they take no part in the softmax and their dlogits and dW rows are exactly 0
(`padded_column_mask` says why that value).

quack's SM90 kernels only: its A-operand transform needs Hopper's register-sourced MMA.
"""

from __future__ import annotations

import torch
from quack.epilogue.frontend import gemm_epilogue
from quack.epilogue.library import identity_epi
from quack.epilogue.math import pexp2
from quack.epilogue.ops import ColVecLoad, ColVecReduce, ColVecSelect, RowVecLoad
from quack.epilogue.scaled_exp import LOG2E, MaxLog2
from quack.linear_cross_entropy import lce_glue
from quack.operand_transform import a_transform
from quack.operand_transform.host import transform_a_operand

PADDED_COLUMN = -16384.0  # added to padded columns; finite: see padded_column_mask
# The gradient GEMMs' K tile: u is resolved per GRAD_TILE_K columns of E
GRAD_TILE_K = 64
# Launches pinned from bench_kernels.py's sweep (bench_classifier_gemm_configs) at d12's 16,384-row chunk on
# an H100 (2026-11-24). The logits GEMM (its N tile is logits_tile_n's; K = C is short, so each tile is
# little arithmetic for its loads and its two-phase epilogue): 2.29 ms against 2.58 for quack's 128 x 192.
# dx (N = C = 768 = 3 x 256): 1.62 ms against 1.90 at 128 x 192. dW: 1.82 ms against 1.87 at cluster 1 x 2
LOGITS_GEMM = dict(tile_M=128, cluster_M=1, cluster_N=2, pingpong=True)
DX_GEMM = dict(tile_M=128, tile_N=256, cluster_M=2, cluster_N=1)
DW_GEMM = dict(tile_M=128, tile_N=192, cluster_M=2, cluster_N=1)

_tile_max = MaxLog2("max_log2")  # per (row, tile) max, delivered as k in log2 units (an integer)
_target = ColVecLoad("target")


def _masked_logits(acc, vocab_mask):
    return {"max_log2": acc + vocab_mask}


@gemm_epilogue(
    ops={"max_log2": _tile_max, "vocab_mask": RowVecLoad("vocab_mask")},
    prepass=_masked_logits,  # the max runs over the masked logits before anything is stored
    prepass_outs=("max_log2",),
    reduces={"sum_exp": ColVecReduce("sum_exp")},
    outs={"target_logit": ColVecSelect("target_logit", idx_op=_target)},
    extra_ops=(_tile_max.out("max_log2_out"), _target),
)
def _scaled_exp_logits(acc, max_log2, vocab_mask):
    e = pexp2((acc + vocab_mask) * LOG2E - max_log2)
    return {"D": e, "sum_exp": e, "target_logit": acc}


@a_transform(vec_size=8, args={"u": "colvec_ktile"})
def _scale_by_u(e, u):  # dx's A operand: E (rows, Vp), u per (row, 64 columns of K)
    return e * u


@a_transform(vec_size=8, args={"u": "kvec_m64"})
def _scale_by_u_transposed(e, u):  # dW's A operand: Eᵀ (Vp, rows), u per (64 rows of M, column of K)
    return e * u


@gemm_epilogue(ops={"v": ColVecLoad("v")})
def _scale_by_v(acc, v):
    return {"D": acc * v}


def scaled_exp_logits(xc, weight, tc, vocab_mask, tile_n, E, tile_k, tile_sum, target_logit, **launch) -> None:
    """The logits GEMM: fills E (n, Vp), and k and Σ E per (row, tile_n columns) (n, Vp / tile_n), and
    the target's raw logit per row (n,). `launch` overrides LOGITS_GEMM (bench_kernels' sweep)."""
    _scaled_exp_logits.gemm(
        xc, weight, E,
        epi_args=dict(max_log2=tile_n, vocab_mask=vocab_mask, sum_exp=tile_sum, max_log2_out=tile_k,
                      target=tc, target_logit=target_logit),
        tile_N=tile_n, **{**LOGITS_GEMM, **launch})


def padded_column_mask(n_cols: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """(n_cols,) fp32: 0 for the real vocabulary, PADDED_COLUMN past it.

    The value is finite on purpose. In a tile holding real columns, a padded one's exp2((z − 16384)·log2e − k)
    is 2^-23000 or less, exactly 0 in fp32. A tile of padding only (a vocabulary padded by a tile or more)
    gets k ≈ −23637 and E ≈ 1, and its u = 2^(k − k_row) is exactly 0 in bf16, so its dlogits are 0 all the
    same. With −inf (or −1e30, whose k is off by more than 1 from the masked logits) such a tile gave
    E = exp2(inf or nan) and NaN gradients."""
    mask = torch.zeros(n_cols, dtype=torch.float32, device=device)
    mask[vocab_size:] = PADDED_COLUMN
    return mask


def logits_tile_n(n_cols: int) -> int | None:
    """The logits GEMM's N tile: it must divide the padded vocabulary (k and Σ E are per whole tile) and
    be a multiple of 64 (u's resolution); 128 first (the sweep's best), None if nothing fits."""
    return next((tile for tile in (128, 192, 256, 64) if n_cols % tile == 0), None)


def supported(x: torch.Tensor, weight: torch.Tensor, chunk_rows: int) -> bool:
    """Whether these operands fit the kernels: bf16 on an SM90 GPU, the padded vocabulary a multiple of
    128 (dW's M tile) with a logits tile dividing it, and every chunk a whole number of 128-row tiles (dx's
    M tile)."""
    n_rows, C = x.shape
    Vp = weight.size(0)
    return (x.is_cuda and x.dtype == weight.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(x.device) == (9, 0)
            and Vp % 128 == 0 and logits_tile_n(Vp) is not None and C % 8 == 0
            and n_rows % 128 == 0 and chunk_rows % 128 == 0)


def linear_cross_entropy_chunks(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                                ignore_index: int, grad_scale: torch.Tensor, chunk_rows: int,
                                dx: torch.Tensor, dw: torch.Tensor) -> torch.Tensor:
    """Sum of the rows' losses; fills dx (N, C) and dw (Vp, C) fp32 with the gradients times grad_scale.

    x (N, C) and weight (Vp, C) bf16 and contiguous, `supported`; targets (N,) int64."""
    n_rows, Vp = x.size(0), weight.size(0)
    tile_n = logits_tile_n(Vp)
    vocab_mask = padded_column_mask(Vp, vocab_size, x.device)
    losses = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    # the only (n, Vp) buffer, one for all chunks: a fresh one per chunk would be allocated while the previous
    # chunk's is still referenced (1.6 GB more at d12's peak)
    E_rows = x.new_empty(min(chunk_rows, n_rows), Vp)
    for start in range(0, n_rows, chunk_rows):
        rows = slice(start, min(start + chunk_rows, n_rows))
        xc, tc = x[rows], targets[rows]  # (n, C), (n,)
        n = xc.size(0)
        E = E_rows[:n]  # (n, Vp), contiguous
        tile_k = torch.empty(n, Vp // tile_n, dtype=torch.float32, device=x.device)  # k per (row, tile)
        tile_sum = torch.empty_like(tile_k)  # Σ E per (row, tile)
        target_logit, v = (torch.empty(n, dtype=torch.float32, device=x.device) for _ in range(2))
        u = x.new_empty(Vp // GRAD_TILE_K, n)  # (Vp/64, n): 2^(k - k_row), row index contiguous
        xs = torch.empty_like(xc)  # v · x
        scaled_exp_logits(xc, weight, tc, vocab_mask, tile_n, E, tile_k, tile_sum, target_logit)
        lce_glue(tile_k, tile_sum, xc, tc, target_logit, E, losses[rows], u, v, xs, tile_n,
                 ignore_index=ignore_index, grad_scale=grad_scale)
        scaled_dx(E, u, v, weight, dx[rows])
        scaled_dw(E, u, xs, dw, accumulate=start > 0)
    return losses.sum()


def scaled_dx(E, u, v, weight, dx, **launch) -> None:
    """dx (n, C) = v ∘ ((u ∘ E) @ W); `launch` overrides DX_GEMM (bench_kernels' sweep)."""
    config = {**DX_GEMM, **launch}
    _scale_by_v.gemm(
        transform_a_operand(_scale_by_u, E, {"u": u}, config["tile_M"], GRAD_TILE_K), weight.mT, dx,
        epi_args=dict(v=v.unsqueeze(0)), transform_a=_scale_by_u, tile_K=GRAD_TILE_K, **config)


def scaled_dw(E, u, xs, dw, accumulate: bool, **launch) -> None:
    """dw (Vp, C) fp32 = (u ∘ E)ᵀ @ xs, or += with `accumulate` (the store adds); `launch` overrides DW_GEMM."""
    config = {**DW_GEMM, **launch}
    identity_epi.gemm(
        transform_a_operand(_scale_by_u_transposed, E.t(), {"u": u}, config["tile_M"], GRAD_TILE_K), xs.mT, dw,
        epi_args={}, transform_a=_scale_by_u_transposed, add_to_output=accumulate, tile_K=GRAD_TILE_K, **config)
