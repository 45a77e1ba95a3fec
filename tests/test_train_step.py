"""gpt2/step.py, the one training step that gpt2.train, the benchmark and the numerics check share."""

import itertools

import pytest
import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.optim import configure_optimizer
from gpt2.step import clip_gradients, forward_backward, optimizer_step

CPU = torch.device("cpu")


def tiny_model() -> GPT:
    return GPT.create(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64), seed=3)


def batch(seed: int, B: int = 4, T: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 64, (B, T + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def test_micro_batches_sum_to_the_whole_batch_gradient():
    """Two micro-batches of 2 rows give the loss and gradients of one batch of 4 (reference: plain
    autograd on the whole batch)."""
    x, y = batch(0)
    model, reference = tiny_model(), tiny_model()
    loss = forward_backward(model, [(x[:2], y[:2]), (x[2:], y[2:])], 2, CPU, "float32")
    _, ref_loss = reference(x, y)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-6, atol=1e-6)
    for (name, p), ref in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, ref.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_reads_exactly_grad_accum_micro_batches():
    """A loader-backed iterator is not read past the step's micro-batches (the next step needs them)."""
    reads = []
    endless = ((reads.append(i), batch(i, B=1))[1] for i in itertools.count())
    forward_backward(tiny_model(), endless, 3, CPU, "float32")
    assert reads == [0, 1, 2]


def test_too_few_micro_batches_is_an_error():
    with pytest.raises(ValueError, match="got 1 micro-batches, expected grad_accum=2"):
        forward_backward(tiny_model(), [batch(0)], 2, CPU, "float32")


def test_clip_then_update_and_skip():
    model = tiny_model()
    forward_backward(model, [batch(1)], 1, CPU, "float32")
    grads = [p.grad.clone() for p in model.parameters()]
    norm = clip_gradients(model.parameters(), 1e-3)
    assert norm > 1e-3  # the norm before clipping
    clipped = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    torch.testing.assert_close(clipped, torch.tensor(1e-3), rtol=1e-4, atol=0)
    assert clip_gradients(model.parameters(), 0) == pytest.approx(1e-3, rel=1e-4)  # 0: no clipping
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = configure_optimizer(model, lr=1.0, weight_decay=0.0)
    optimizer_step(optimizer, lr=1e-2, skip=True)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    optimizer_step(optimizer, lr=1e-2)
    assert optimizer.param_groups[0]["lr"] == 1e-2
    assert all(p.grad is None for p in model.parameters())
    assert not all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
