"""gpt2/step.py, the one training step that gpt2.train, the benchmark and the numerics check share."""

import itertools

import pytest
import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.optim import configure_optimizer
from gpt2.step import (CastWeights, FlatGradients, MicroStepGraph, clip_gradients, forward_backward,
                       optimizer_step)
from tests.fixtures.numerics import rel_err, without_triton

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


def test_cuda_graphs_need_a_cuda_device_and_no_ddp(tmp_path):
    """The CPU has no CUDA graphs: refused with what to change, by the command a user types. Several ranks
    are valid (the graph averages the gradients itself), and a DDP-wrapped model is refused by the graph."""
    import subprocess
    import sys

    from gpt2.train_config import TrainConfig, validate

    small = dict(batch_size=4, seq_len=64, total_batch_size=512)
    validate(TrainConfig(cuda_graphs=True, **small), world_size=2, check_inputs=False)
    with pytest.raises(ValueError, match="averages gradients over ranks itself; pass the model without DDP"):
        MicroStepGraph(torch.nn.parallel.DistributedDataParallel.__new__(torch.nn.parallel.DistributedDataParallel),
                       1, CPU, "float32")
    run = subprocess.run([sys.executable, "-m", "gpt2.train", "--device", "cpu", "--cuda-graphs", "--model", "d6",
                          "--out-dir", str(tmp_path / "run"), "--train-data", str(tmp_path / "none_*.bin")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "cuda_graphs needs a CUDA device, this run is on the CPU; drop --cuda-graphs" in run.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_cast_weights_are_the_matrices_as_the_forward_would_cast_them_once_refreshed():
    """CastWeights holds the fused model's block matrices in bf16, at fixed tensors (a CUDA graph replays their
    addresses), made anew from the parameters by each refresh (MicroStepGraph: at every step's first micro-step)."""
    model = GPT.create(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64), seed=3,
                       use_kernels=True)
    casts = CastWeights(model, torch.bfloat16)
    copies = list(casts.copies)
    for _ in range(2):
        casts.refresh()
        assert len(copies) == 8 and all(a is b for a, b in zip(casts.copies, copies))
        for copy, p in zip(copies, model.matrices()):
            assert copy.dtype == torch.bfloat16 and torch.equal(copy, p.detach().bfloat16())
            assert copy.grad_fn is None and not copy.requires_grad  # no autograd graph kept from step to step
        with torch.no_grad():  # an optimizer step
            for p in model.matrices():
                p.add_(0.01)
    assert CastWeights(tiny_model(), torch.bfloat16).copies == []  # the plain path: autocast casts


def test_micro_step_graph_takes_the_matrices_once(monkeypatch):
    """MicroStepGraph asks the model for its matrices once, for the casts it keeps (none on the plain path)."""
    model = GPT.create(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64), seed=3,
                       use_kernels=True)
    calls = []
    matrices = model.matrices
    monkeypatch.setattr(model, "matrices", lambda: calls.append(1) or matrices())
    graph = MicroStepGraph(model, 2, CPU, "bfloat16")
    assert len(calls) == 1 and graph.casts.params == matrices()
    assert MicroStepGraph(tiny_model(), 2, CPU, "bfloat16").casts is None


def test_flat_gradients_leave_the_projections_to_their_gemms():
    """FlatGradients hands the views of `in_gemm` to the model (gemm_views, in that order) and adds the others'."""
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*shape, generator=g)) for shape in ((6, 5), (6,), (3, 7), (11,))]
    flat = FlatGradients(params, in_gemm=[params[2], params[0]])
    flat.attach_zeroed()
    assert [v.data_ptr() for v in flat.gemm_views] == [params[2].grad.data_ptr(), params[0].grad.data_ptr()]
    assert flat.autograd_params == [params[1], params[3]]
    grads = [torch.randn(6, generator=g), torch.randn(11, generator=g)]
    flat.accumulate(grads)
    assert torch.equal(params[1].grad, grads[0]) and torch.equal(params[3].grad, grads[1])
    assert not params[0].grad.any() and not params[2].grad.any()
    with pytest.raises(ValueError, match=r"in_gemm parameters \[\(2, 2\)\] are none of its trainable parameters"):
        FlatGradients(params, in_gemm=[torch.nn.Parameter(torch.zeros(2, 2))])


@pytest.mark.parametrize("backend", [None, "aot_eager"])
def test_micro_steps_adding_the_projections_gradients_in_their_gemms_sum_what_autograd_does(backend, monkeypatch):
    """The fused model's micro-steps through MicroStepGraph's FlatGradients (its eager micro-steps: on a CPU it never
    captures), attn.c_proj's and mlp.c_proj's gradients added by their GEMMs, against autograd's .grad sums (the
    model's forward without weight_grads), at an odd width; compiled too (AOTAutograd functionalizes the adds).
    LayerNorm and the loss run their PyTorch references, not Triton's interpreter: they are not under test here,
    and the interpreter took most of the test's two minutes of CPU."""
    without_triton(monkeypatch)
    config = GPTConfig(n_layer=2, n_head=3, n_embd=36, block_size=16, vocab_size=64)
    models = [GPT.create(config, seed=3, use_kernels=True) for _ in range(2)]
    runs = [torch.compile(m, backend=backend, fullgraph=True) if backend else m for m in models]
    graph = MicroStepGraph(runs[1], 2, CPU, "float32", warmup=100)
    assert len(graph.gradients.gemm_views) == 4
    for step in range(2):  # the second step starts from zeroed views again
        micro = [batch(seed=10 * step + i, T=13) for i in range(2)]
        losses = [forward_backward(run, micro, 2, CPU, "float32", step_graph)
                  for run, step_graph in zip(runs, (None, graph))]
        assert torch.equal(*losses)
        for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
            # fp32 on the CPU: BLAS may add a product into the buffer in parts (on CUDA: the same bits, tested below)
            assert rel_err(b.grad, a.grad) < 1e-6, name
        for m in models:
            m.zero_grad(set_to_none=True)


def graphed_and_eager_runs(use_kernels: bool, steps: int = 3, grad_accum: int = 3):
    """The same model trained `steps` optimizer steps eagerly and through MicroStepGraph (warm-up 2, so
    the capture falls mid-step); yields (eager params, graphed params, eager loss, graphed loss) per step."""
    from gpt2_kernels import configure_kernels
    from gpt2_kernels.attention import enable_all_sdpa_backends

    cuda = torch.device("cuda")
    config = GPTConfig(n_layer=2, n_head=2, n_embd=128, block_size=64, vocab_size=512)
    if use_kernels:  # the training default: checked attention backend, FA4 and quack where installed
        configure_kernels(config.n_head, config.head_size)
    try:
        models = [GPT.create(config, seed=5, device=cuda, use_kernels=use_kernels) for _ in range(2)]
        runs = [torch.compile(m) if use_kernels else m for m in models]
        optimizers = [configure_optimizer(m, lr=1e-3, weight_decay=0.1, fused=True) for m in models]
        graph = MicroStepGraph(runs[1], grad_accum, cuda, "bfloat16", warmup=2)
        g = torch.Generator(device=cuda).manual_seed(0)
        for _ in range(steps):
            tokens = torch.randint(0, 512, (grad_accum, 4, 65), device=cuda, generator=g)
            losses = []
            for run, optimizer, step_graph in zip(runs, optimizers, (None, graph)):
                micro = [(t[:, :-1], t[:, 1:]) for t in tokens]  # a fresh batch every micro-step
                losses.append(forward_backward(run, micro, grad_accum, cuda, "bfloat16", step_graph))
                clip_gradients(run.parameters(), 1.0)
                optimizer_step(optimizer, lr=1e-3)
            yield [p.detach() for p in models[0].parameters()], [p.detach() for p in models[1].parameters()], *losses
    finally:
        enable_all_sdpa_backends()


@pytest.mark.gpu
@pytest.mark.parametrize("use_kernels", [False, True], ids=["plain-eager", "kernels-compiled"])
def test_cuda_graph_steps_equal_eager_steps_bit_for_bit(use_kernels):
    """Replayed micro-steps compute what eager ones do, on fresh inputs each time, with each step's
    gradients starting from zero: the parameters after every step are identical (a graph that kept its
    captured batch or last step's gradients would differ at once)."""
    for step, (eager, graphed, eager_loss, graphed_loss) in enumerate(graphed_and_eager_runs(use_kernels)):
        assert torch.equal(eager_loss, graphed_loss), f"step {step}: loss {graphed_loss} != eager {eager_loss}"
        for i, (a, b) in enumerate(zip(eager, graphed)):
            assert torch.equal(a, b), f"step {step}, parameter {i}: max |diff| {(a - b).abs().max().item():.3e}"
