"""gpt2_kernels.cross_entropy: fused lm_head + cross-entropy vs autograd through the plain formula.

On CPU the Triton kernel runs under TRITON_INTERPRET=1 (tests/conftest.py), so shapes stay tiny.
Tolerances (relative L2 error vs a float64 reference): fp32 inputs 1e-5 (fp32 accumulation over at
most a few hundred terms); bf16 inputs 2e-2 (logits and dlogits are rounded to bf16, 2^-9 relative,
and the matmuls accumulate bf16 products).
"""

import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gpt2_kernels.cross_entropy as ce
from gpt2_kernels.cross_entropy import (
    cross_entropy_rows_,
    linear_cross_entropy,
    linear_cross_entropy_reference,
)
from tests.fixtures.numerics import rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(N, C, V, Vp, dtype, seed, n_ignored=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, generator=g)
    w = torch.randn(Vp, C, generator=g) * 0.5
    w[V:] = 0  # padding rows, as the model keeps them
    targets = torch.randint(0, V, (N,), generator=g)
    targets[torch.randperm(N, generator=g)[:n_ignored]] = -1
    return x.to(DEVICE, dtype), w.to(DEVICE, dtype), targets.to(DEVICE)


def reference(x, w, targets, V):
    """Loss and gradients in float64 by autograd through F.cross_entropy (independent of the kernel)."""
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    loss = linear_cross_entropy_reference(x64, w64, targets, V, ignore_index=-1)
    loss.backward()
    return loss.detach(), x64.grad, w64.grad


@pytest.mark.parametrize(
    "N, C, V, Vp, chunk_rows, dtype, tol",
    [
        (37, 24, 203, 256, 16, torch.float32, 1e-5),  # rows not a multiple of the chunk, C not 2^k
        (37, 24, 203, 256, 16, torch.bfloat16, 2e-2),
        (9, 40, 5000, 5056, 4, torch.float32, 1e-5),  # vocabulary wider than one 4096-column block
    ],
)
def test_matches_reference(N, C, V, Vp, chunk_rows, dtype, tol):
    x, w, targets = make_inputs(N, C, V, Vp, dtype, seed=N + C)
    x.requires_grad_()
    w.requires_grad_()
    loss = linear_cross_entropy(x, w, targets, V, chunk_rows=chunk_rows)
    loss.backward()
    ref_loss, ref_dx, ref_dw = reference(x, w, targets, V)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - ref_loss.item()) <= tol * abs(ref_loss.item())
    assert x.grad.dtype == dtype and w.grad.dtype == dtype
    assert rel_err(x.grad, ref_dx) < tol
    assert rel_err(w.grad, ref_dw) < tol
    assert torch.all(w.grad[V:] == 0), "padded vocabulary rows must get exactly zero gradient"


def test_backward_scales_by_incoming_gradient():
    """Grad accumulation divides the loss by the micro-step count: gradients must follow."""
    x, w, targets = make_inputs(11, 24, 150, 160, torch.float32, seed=3)
    x.requires_grad_()
    w.requires_grad_()
    (linear_cross_entropy(x, w, targets, 150, chunk_rows=8) * 0.25).backward()
    _, ref_dx, ref_dw = reference(x, w, targets, 150)
    assert rel_err(x.grad, 0.25 * ref_dx) < 1e-5
    assert rel_err(w.grad, 0.25 * ref_dw) < 1e-5


def test_no_grad_gives_same_loss():
    x, w, targets = make_inputs(13, 24, 150, 160, torch.float32, seed=4)
    with torch.no_grad():
        loss = linear_cross_entropy(x, w, targets, 150, chunk_rows=5)
    assert abs(loss.item() - reference(x, w, targets, 150)[0].item()) < 1e-5


def test_compute_dtype_bf16_from_fp32_inputs():
    """Under autocast the model passes fp32 params with compute_dtype=bf16; grads stay fp32."""
    x, w, targets = make_inputs(16, 24, 150, 160, torch.float32, seed=5)
    x.requires_grad_()
    w.requires_grad_()
    linear_cross_entropy(x, w, targets, 150, compute_dtype=torch.bfloat16, chunk_rows=7).backward()
    _, ref_dx, ref_dw = reference(x, w, targets, 150)
    assert w.grad.dtype == torch.float32
    assert rel_err(x.grad, ref_dx) < 2e-2 and rel_err(w.grad, ref_dw) < 2e-2


@pytest.mark.parametrize("block", [32, 128], ids=["several-blocks", "one-block"])
def test_rows_kernel_writes_every_gradient_column(block, monkeypatch):
    """Poisoned logits buffer: every column, padded ones included, must be overwritten, whether the
    row spans several column blocks or one."""
    monkeypatch.setattr("gpt2_kernels.cross_entropy.ROWS_BLOCK", block)
    N, V, Vp = 5, 90, 128
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(N, Vp, generator=g).to(DEVICE)
    targets = torch.tensor([0, 89, -1, 7, 45], device=DEVICE)
    z = logits[:, :V].clone().requires_grad_()
    torch.nn.functional.cross_entropy(z.double(), targets, ignore_index=-1, reduction="sum").backward()
    logits[:, V:] = float("nan")  # poison: padding columns are never read, only written
    scale = torch.full((1,), 0.5, device=DEVICE)
    losses = cross_entropy_rows_(logits, targets, V, ignore_index=-1, grad_scale=scale)
    assert not torch.isnan(logits).any()
    assert torch.all(logits[:, V:] == 0)
    assert rel_err(logits[:, :V], 0.5 * z.grad) < 1e-5
    assert losses[2] == 0  # ignored row


def test_opcheck_fake_and_autograd_registrations():
    x, w, targets = make_inputs(6, 8, 20, 32, torch.float32, seed=7)
    op = torch.ops.gpt2_kernels.linear_cross_entropy.default
    torch.library.opcheck(op, (x.requires_grad_(), w.requires_grad_(), targets, 20, -1, torch.float32, 4, True),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_bad_weight_shape_is_rejected():
    x, w, targets = make_inputs(4, 8, 20, 32, torch.float32, seed=8)
    with pytest.raises(ValueError, match="weight must be"):
        linear_cross_entropy(x, w[:10], targets, 20)


@pytest.mark.parametrize("rows, Vp, C", [(37, 203, 24), (16, 64, 40)])
def test_dw_accumulates_each_chunk_product_unrounded(rows, Vp, C):
    """dW += dlogits.T @ x with bf16 operands and an fp32 accumulator: the chunk's product is not
    rounded to bf16 before the add (on CUDA: cuBLAS's fp32-output epilogue; elsewhere an fp32 product).
    A bf16-rounded product would be off by about 2^-9 relative, 100x this tolerance."""
    from gpt2_kernels.cross_entropy import accumulate_dw

    g = torch.Generator().manual_seed(rows)
    dlogits = torch.randn(rows, Vp, generator=g).to(DEVICE, torch.bfloat16)
    xc = torch.randn(rows, C, generator=g).to(DEVICE, torch.bfloat16)
    dw = torch.randn(Vp, C, generator=g).to(DEVICE) * 1e-3  # small: the product dominates the sum
    expected = dw.double() + dlogits.double().t() @ xc.double()
    out = accumulate_dw(dw.clone(), dlogits, xc)
    assert out.dtype == torch.float32 and out.shape == (Vp, C)
    assert rel_err(out, expected) < 2e-6


def test_chunks_write_their_logits_into_one_buffer():
    """The module's promise, one chunk of logits held at a time: every chunk's logits land in the same
    memory. A fresh tensor per chunk is allocated while the previous chunk's is still referenced, so two
    would be held at the peak (1.6 GB more at d12's 16,384-row chunks)."""
    N, C, V, Vp, chunk_rows = 40, 8, 100, 128, 16  # chunks of 16, 16 and 8 rows
    x, w, targets = make_inputs(N, C, V, Vp, torch.float32, seed=5)
    addresses = []

    class LogitsAddresses(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket is torch.ops.aten.mm and out.size(-1) == Vp:
                addresses.append(out.data_ptr())
            return out

    dx, dw = torch.empty_like(x), torch.zeros(Vp, C, device=DEVICE)
    with LogitsAddresses():  # the custom op's loop itself: a dispatch mode sees a custom op as one call
        ce._triton_chunks(x, w, targets, V, -1, torch.ones(1, device=DEVICE), chunk_rows, dx, dw)
    assert len(addresses) == 3, "one logits matmul per chunk"
    assert len(set(addresses)) == 1


@pytest.mark.gpu
def test_scaled_exp_classifier_holds_one_chunk_of_logits_on_gpu():
    """The same promise for quack's scaled-exp chunks, by the allocator's peak: one (rows, Vp) buffer E for
    all chunks, not two."""
    N, C, V, Vp, chunk_rows = 3 * 4096, 768, 50257, 50304, 4096
    name = ce.configure_classifier(torch.bfloat16, "cuda", n_embd=C)
    try:
        if name != "quack-scaled-exp":
            pytest.skip(f"quack-kernels not installed or not an SM90 GPU here ({name})")
        x, w, targets = make_inputs(N, C, V, Vp, torch.bfloat16, seed=9)
        x.requires_grad_()
        linear_cross_entropy(x, w, targets, V, chunk_rows=chunk_rows)  # compiles quack's kernels
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        linear_cross_entropy(x, w, targets, V, chunk_rows=chunk_rows)
        torch.cuda.synchronize()
        E_bytes, dw_bytes = chunk_rows * Vp * 2, Vp * C * (4 + 2)  # dW in fp32, then in W's dtype
        assert torch.cuda.max_memory_allocated() - before < E_bytes + dw_bytes + 64 * 2**20
    finally:
        ce._scaled_exp_on_cuda = False


@pytest.mark.gpu
@pytest.mark.parametrize("N, C, V, Vp, chunk_rows", [
    (640, 768, 50257, 50304, 256),  # GPT-2's padded vocabulary; chunks of 256, 256 and 128 rows
    (256, 768, 1000, 1152, 128),  # 152 padded columns: the last 128-column tile is padding only
])
def test_scaled_exp_classifier_on_gpu(N, C, V, Vp, chunk_rows):
    """quack's scaled-exp chunks (where installed, on SM90) against float64 autograd: the padded columns
    out of the softmax with exactly zero dW rows, ignored rows, a last chunk shorter than the others; and
    against the Triton path on the same inputs."""
    name = ce.configure_classifier(torch.bfloat16, "cuda", n_embd=C)
    try:
        if name != "quack-scaled-exp":
            pytest.skip(f"quack-kernels not installed or not an SM90 GPU here ({name})")
        x, w, targets = make_inputs(N, C, V, Vp, torch.bfloat16, seed=9, n_ignored=7)
        w = (w.float() * 0.2).bfloat16()  # logits of a few units, as in training
        grads = {}
        for path in ("scaled-exp", "triton"):
            ce._scaled_exp_on_cuda = path == "scaled-exp"
            xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
            loss = linear_cross_entropy(xg, wg, targets, V, chunk_rows=chunk_rows)
            loss.backward()
            grads[path] = loss.detach(), xg.grad, wg.grad
        ref_loss, ref_dx, ref_dw = reference(x, w, targets, V)
        loss, dx, dw = grads["scaled-exp"]
        assert abs(loss.item() - ref_loss.item()) <= 1e-3 * ref_loss.item()
        assert rel_err(dx, ref_dx) < 2e-2 and rel_err(dw, ref_dw) < 2e-2
        assert torch.all(dw[V:] == 0), "padded vocabulary rows must get exactly zero gradient"
        triton_loss, triton_dx, triton_dw = grads["triton"]
        assert abs(loss.item() - triton_loss.item()) <= 1e-3 * ref_loss.item()
        assert rel_err(dx, triton_dx) < 2e-2 and rel_err(dw, triton_dw) < 2e-2
    finally:
        ce._scaled_exp_on_cuda = False


def test_without_quack_the_classifier_keeps_its_triton_pass():
    """Where quack-kernels is not installed (this CPU machine), configuring asks nothing of a GPU and
    keeps the Triton softmax pass."""
    try:
        import quack  # noqa: F401
        pytest.skip("quack-kernels is installed here")
    except ImportError:
        pass
    assert ce.configure_classifier(torch.bfloat16, "cpu") == "triton-softmax"
    assert not ce._scaled_exp_on_cuda


@pytest.mark.parametrize("fault", [None, "dx off by half", "padded rows with gradient", "kernel raises"])
def test_startup_check_keeps_a_disagreeing_scaled_exp_kernel_out(monkeypatch, fault):
    """configure_classifier's check is what keeps a wrong scaled-exp kernel out of training. This machine
    has no quack, so a stand-in takes its place: the Triton path's answer, broken on purpose, or a kernel
    that fails outright (a compile error). Broken, the check raises and the Triton pass stays on; unbroken,
    the path is turned on."""
    def chunks(x, w, targets, vocab_size, ignore_index, grad_scale, chunk_rows, dx, dw):
        if fault == "kernel raises":
            raise RuntimeError("stand-in compile error")
        loss_sum, right_dw = ce._triton_chunks(x, w, targets, vocab_size, ignore_index, grad_scale, chunk_rows, dx,
                                               torch.zeros_like(dw))
        dw.copy_(right_dw)
        if fault == "dx off by half":
            dx.mul_(1.5)
        elif fault == "padded rows with gradient":
            dw[vocab_size:] = 1e-9  # far under the relative-error tolerance: only the exact-zero rule sees it
        return loss_sum

    monkeypatch.setattr(ce, "quack_capability", lambda: (9, 0))
    monkeypatch.setattr(ce, "_scaled_exp", lambda: types.SimpleNamespace(
        supported=lambda *_: True, linear_cross_entropy_chunks=chunks))
    try:
        if fault is None:
            assert ce.configure_classifier(torch.bfloat16, "cpu", n_embd=16) == "quack-scaled-exp"
            assert ce._scaled_exp_on_cuda
        else:
            with pytest.raises(RuntimeError, match="disagrees with the reference|stand-in compile error"):
                ce.configure_classifier(torch.bfloat16, "cpu", n_embd=16)
            assert not ce._scaled_exp_on_cuda
    finally:
        ce._scaled_exp_on_cuda = False
