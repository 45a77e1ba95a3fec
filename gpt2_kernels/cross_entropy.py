"""Fused classifier: lm_head matmul + softmax cross-entropy + its gradients, over row chunks.

The plain path materialises (B*T, V) logits (6.6 GB in bf16 for d12 at B=64, T=1024), an fp32 copy for
the loss (13 GB) and the same again for dlogits in backward. Here, per chunk of rows:

    logits = x_chunk @ W.T                      (n, Vp) in the compute dtype, one chunk buffer
    Triton: loss per row, and dlogits = softmax - onehot written over the logits in place
    dx_chunk = dlogits @ W,  dW += dlogits.T @ x_chunk

so the forward pass already holds the gradients (the loss is the last op of the graph, llm.c's
fused_classifier does the same) and backward only scales them by the incoming gradient. Peak extra
memory is one chunk of logits plus an fp32 dW. Padded vocabulary columns (vocab_size..Vp) take no part
in the softmax and get zero gradient, so the padding rows of W stay zero.

On a Hopper GPU with quack-kernels installed (the `gpu` extra), `configure_classifier` switches the
training chunks to gpt2_kernels/cross_entropy_scaled_exp.py: the softmax moves into the logits GEMM's
epilogue, and the Triton pass that reads each logit twice goes.

`linear_cross_entropy` is the entry point; `linear_cross_entropy_reference` is the plain formula.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpt2_kernels._quack import CHECK_TOLERANCE, max_relative_error, quack_capability
from gpt2_kernels._triton import jit, next_power_of_2, tl, use_triton

# (16384, 50304) bf16 logits = 1.6 GB, one buffer for all chunks. Against 8192 rows: d12's classifier forward +
# backward 29.3 against 30.5 ms per micro-step on an H100 (bench_kernels, 2026-11-23; fewer, larger dW and dx
# matmuls), for 0.8 GB more at the peak (docs/benchmarks.md, "Memory")
DEFAULT_CHUNK_ROWS = 16384
# rows kernel launch: columns per block, warps. 2048 x 4 measured 0.71 ms per 8192-row chunk on an H200
# against 0.75 for 4096 x 8, and 0.90 against 0.89 on an H100 (bench_kernels sweeps the others)
ROWS_BLOCK, ROWS_WARPS = 2048, 4

# Whether training chunks run quack's scaled-exp GEMMs on CUDA; set by configure_classifier before a
# model is compiled
_scaled_exp_on_cuda = False


def _scaled_exp():
    """gpt2_kernels.cross_entropy_scaled_exp, imported only where quack is (configure_classifier checked)."""
    from gpt2_kernels import cross_entropy_scaled_exp

    return cross_entropy_scaled_exp


def configure_classifier(dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cuda",
                         scaled_exp: bool = True, n_embd: int = 768) -> str:
    """Enable the scaled-exp classifier on CUDA where quack's SM90 kernels run and match the plain
    formula (a 256-row check over two chunks, padded vocabulary and ignored rows included); returns
    what runs."""
    global _scaled_exp_on_cuda
    _scaled_exp_on_cuda = False
    if not (scaled_exp and dtype == torch.bfloat16 and quack_capability() == (9, 0)):
        return "triton-softmax"
    V, Vp, N = 1000, 1152, 256
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(N, n_embd, device=device, generator=g).to(dtype)
    w = torch.randn(Vp, n_embd, device=device, generator=g) / n_embd**0.5
    w[V:] = 0
    targets = torch.randint(0, V, (N,), device=device, generator=g)
    targets[::17] = -1
    _scaled_exp_on_cuda = True  # the op takes the scaled-exp path only while this is set
    try:
        loss, dx, dw = _linear_cross_entropy_op(x, w, targets, V, -1, dtype, N // 2, True)
    finally:
        _scaled_exp_on_cuda = False  # on again below only when the check passes
    x_ref, w_ref = x.float().requires_grad_(), w.clone().requires_grad_()
    ref = linear_cross_entropy_reference(x_ref, w_ref, targets, V, ignore_index=-1)
    ref.backward()
    err = max_relative_error(((loss, ref.detach()), (dx, x_ref.grad), (dw, w_ref.grad)))
    if err > CHECK_TOLERANCE or bool(dw[V:].any()):
        raise RuntimeError(f"quack's scaled-exp classifier disagrees with the reference at width {n_embd}: "
                           f"relative error {err:.2e}, padded rows' gradient {float(dw[V:].abs().max()):.2e}; "
                           "`pip uninstall flash-attn-4 quack-kernels` (the gpu extra) to train without it")
    _scaled_exp_on_cuda = True
    return "quack-scaled-exp"


@jit
def _cross_entropy_rows_kernel(
    logits_ptr,  # (n_rows, row_stride): overwritten with dlogits when COMPUTE_GRAD
    row_stride,
    targets_ptr,  # (n_rows,) int64
    losses_ptr,  # (n_rows,) fp32
    ignore_index,
    grad_scale_ptr,  # (1,) fp32: dlogits are multiplied by it (1 / rows counted in the mean)
    # compile-time loop bounds (one specialisation per vocabulary; Triton's interpreter also needs them)
    n_vocab: tl.constexpr,  # real vocabulary: softmax runs over columns [0, n_vocab)
    n_cols: tl.constexpr,  # padded width: gradient columns [n_vocab, n_cols) are written as 0
    COMPUTE_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    target = tl.load(targets_ptr + row)
    valid = target != ignore_index

    # pass 1: online max and sum of exponentials (fp32), one block of columns at a time. (A block
    # holding the whole row, read once, measured 1.5 ms per 8192-row chunk against 0.9 on an H100:
    # Triton spills the row from registers.)
    m = float("-inf")
    s = 0.0
    for start in range(0, n_vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        z = tl.load(row_ptr + cols, mask=cols < n_vocab, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(z, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
        m = m_new
    lse = m + tl.log(s)

    target_logit = tl.load(row_ptr + tl.where(valid, target, 0)).to(tl.float32)
    tl.store(losses_ptr + row, tl.where(valid, lse - target_logit, 0.0))

    if COMPUTE_GRAD:
        # pass 2: dloss/dlogits = (softmax - onehot) * grad_scale, last block first: the blocks pass 1
        # read last are the likeliest to be still in L2
        grad_scale = tl.load(grad_scale_ptr)
        n_blocks: tl.constexpr = (n_cols + BLOCK - 1) // BLOCK
        for i in range(0, n_blocks):
            cols = (n_blocks - 1 - i) * BLOCK + tl.arange(0, BLOCK)
            z = tl.load(row_ptr + cols, mask=cols < n_vocab, other=float("-inf")).to(tl.float32)
            grad = tl.exp(z - lse) - tl.where(cols == target, 1.0, 0.0)
            grad = tl.where(valid, grad * grad_scale, 0.0)
            tl.store(row_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=cols < n_cols)


def cross_entropy_rows_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    n_vocab: int,
    ignore_index: int,
    grad_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Plain-PyTorch rows kernel: per-row losses (fp32) and, given a grad_scale, dlogits * grad_scale
    (logits' dtype, padded columns 0)."""
    logp = torch.log_softmax(logits[:, :n_vocab].float(), dim=-1)  # (n, V)
    valid = targets != ignore_index
    safe_targets = targets.clamp(min=0).unsqueeze(1)  # (n, 1): ignored rows read column 0, then drop it
    losses = torch.where(valid, -logp.gather(1, safe_targets).squeeze(1), 0.0)
    if grad_scale is None:
        return losses, None
    g = logp.exp().scatter_add_(1, safe_targets, -torch.ones_like(safe_targets, dtype=logp.dtype))
    grad = torch.zeros_like(logits)
    grad[:, :n_vocab] = torch.where(valid.unsqueeze(1), g * grad_scale, 0.0).to(logits.dtype)
    return losses, grad


def cross_entropy_rows_(
    logits: torch.Tensor,
    targets: torch.Tensor,
    n_vocab: int,
    ignore_index: int,
    grad_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-row losses (fp32, 0 for ignored rows) of (n, Vp) logits over their first n_vocab columns.

    With a `grad_scale` (fp32 tensor of one element), the logits are overwritten in place with
    dloss/dlogits * grad_scale, padded columns zero.
    """
    n_rows, n_cols = logits.shape
    compute_grad = grad_scale is not None
    if not use_triton(logits):
        losses, grad = cross_entropy_rows_reference(logits, targets, n_vocab, ignore_index, grad_scale)
        if compute_grad:
            logits.copy_(grad)
        return losses
    losses = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    _cross_entropy_rows_kernel[(n_rows,)](
        logits, logits.stride(0), targets, losses, ignore_index,
        grad_scale if compute_grad else losses,  # never read without COMPUTE_GRAD
        n_vocab=n_vocab, n_cols=n_cols, COMPUTE_GRAD=compute_grad,
        BLOCK=min(ROWS_BLOCK, next_power_of_2(n_cols)), num_warps=ROWS_WARPS,
    )
    return losses


def accumulate_dw(dw: torch.Tensor, dlogits: torch.Tensor, xc: torch.Tensor) -> torch.Tensor:
    """dw + dlogits.T @ xc with dw fp32 and the chunk's operands in the compute dtype: fp32 accumulation
    across chunks, the chunk's product rounded only by the matmul's own fp32 accumulator.

    On CUDA the add happens in cuBLAS's epilogue (addmm with an fp32 output, beta = 1), so no bf16
    (Vp, C) product is written and read back by a separate mixed-dtype add (10 ms per d12 step on an
    H200). Elsewhere (CPU: no such kernel) the product is formed in fp32 and added.
    """
    if dlogits.dtype == dw.dtype:
        return dw.addmm_(dlogits.t(), xc)
    if dw.is_cuda:
        return torch.addmm(dw, dlogits.t(), xc, out_dtype=torch.float32)
    return dw.addmm_(dlogits.t().float(), xc.float())


def _triton_chunks(x, w, targets, vocab_size, ignore_index, grad_scale, chunk_rows, dx, dw):
    """The chunk loop of the module docstring -> (sum of the rows' losses, dw); dx filled in place."""
    loss_sum = torch.zeros((), dtype=torch.float32, device=x.device)
    # one logits buffer for all chunks: a fresh one per chunk would be allocated while the previous chunk's
    # is still referenced, so two would be held at the peak
    logits_rows = x.new_empty(min(chunk_rows, x.size(0)), w.size(0), dtype=w.dtype)
    for start in range(0, x.size(0), chunk_rows):
        rows = slice(start, start + chunk_rows)
        xc = x[rows].to(w.dtype)  # (n, C)
        logits = torch.mm(xc, w.t(), out=logits_rows[: xc.size(0)])  # (n, Vp): the only logits ever held
        loss_sum += cross_entropy_rows_(logits, targets[rows], vocab_size, ignore_index, grad_scale).sum()
        if grad_scale is not None:  # logits now hold dloss/dlogits
            dx[rows] = logits @ w  # (n, C)
            dw = accumulate_dw(dw, logits, xc)
    return loss_sum, dw


@torch.library.custom_op("gpt2_kernels::linear_cross_entropy", mutates_args=())
def _linear_cross_entropy_op(
    x: torch.Tensor,  # (N, C)
    weight: torch.Tensor,  # (Vp, C)
    targets: torch.Tensor,  # (N,) int64
    vocab_size: int,
    ignore_index: int,
    compute_dtype: torch.dtype,
    chunk_rows: int,
    compute_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (mean loss (fp32 scalar), dloss/dx (N, C), dloss/dweight (Vp, C)); grads empty without compute_grad."""
    x, targets = x.contiguous(), targets.contiguous()
    # mean over non-ignored rows (all rows ignored gives nan, as F.cross_entropy does); kept on the
    # device so that no host sync stalls the pipeline
    n_valid = (targets != ignore_index).sum().float()
    grad_scale = (1.0 / n_valid).reshape(1) if compute_grad else None
    w = weight.to(compute_dtype)  # one cast of W per call, as autocast would do
    dx = torch.empty_like(x) if compute_grad else x.new_empty(0)
    with torch.autocast(x.device.type, enabled=False):  # compute_dtype decides, not an outer autocast
        if compute_grad and _scaled_exp_on_cuda and _scaled_exp().supported(x, w, chunk_rows):
            dw = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)  # the first chunk stores
            loss_sum = _scaled_exp().linear_cross_entropy_chunks(
                x, w, targets, vocab_size, ignore_index, grad_scale, chunk_rows, dx, dw)
        else:
            dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if compute_grad else None
            loss_sum, dw = _triton_chunks(x, w, targets, vocab_size, ignore_index, grad_scale, chunk_rows, dx, dw)
    loss = loss_sum / n_valid
    if not compute_grad:
        return loss, dx, x.new_empty(0)
    return loss, dx, dw.to(weight.dtype)


@_linear_cross_entropy_op.register_fake
def _(x, weight, targets, vocab_size, ignore_index, compute_dtype, chunk_rows, compute_grad):
    loss = x.new_empty((), dtype=torch.float32)
    if not compute_grad:
        return loss, x.new_empty(0), x.new_empty(0)
    return loss, torch.empty_like(x), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    _, dx, dw = output
    ctx.save_for_backward(dx, dw)


def _backward(ctx, grad_loss, _grad_dx, _grad_dw):
    dx, dw = ctx.saved_tensors
    return dx * grad_loss.to(dx.dtype), dw * grad_loss.to(dw.dtype), None, None, None, None, None, None


_linear_cross_entropy_op.register_autograd(_backward, setup_context=_setup_context)


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    vocab_size: int,
    ignore_index: int = -1,
    compute_dtype: torch.dtype | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> torch.Tensor:
    """Mean cross-entropy of `x @ weight[:vocab_size].T` against `targets`, never holding all logits.

    x (..., C); weight (Vp, C) with Vp >= vocab_size (rows past vocab_size are padding and get zero
    gradient); targets (...) int64 with `ignore_index` rows skipped. `compute_dtype` is the dtype of
    the matmuls (default x's; pass bf16 under autocast, which custom ops do not see).
    """
    C = x.size(-1)
    if chunk_rows <= 0:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
    if weight.dim() != 2 or weight.size(1) != C or weight.size(0) < vocab_size:
        raise ValueError(f"weight must be (Vp >= {vocab_size}, {C}), got {tuple(weight.shape)}")
    if targets.shape != x.shape[:-1]:
        raise ValueError(f"targets shape {tuple(targets.shape)} must equal x's leading shape {tuple(x.shape[:-1])}")
    compute_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    loss, _, _ = _linear_cross_entropy_op(
        x.reshape(-1, C), weight, targets.reshape(-1), vocab_size,
        ignore_index, compute_dtype or x.dtype, chunk_rows, compute_grad,
    )
    return loss


def linear_cross_entropy_reference(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int, ignore_index: int = -1
) -> torch.Tensor:
    """The plain formula: full fp32 logits over the real vocabulary, then F.cross_entropy."""
    logits = x @ weight[:vocab_size].t()  # (..., V)
    return F.cross_entropy(logits.reshape(-1, vocab_size).float(), targets.reshape(-1), ignore_index=ignore_index)
