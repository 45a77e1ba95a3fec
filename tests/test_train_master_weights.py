"""Master weights (llm.c's -w 1): float32 masters in the optimizer, stochastically rounded bfloat16 parameters.

The rounding against hand computations on chosen bit patterns and against its expectation; the optimizer
against plain torch AdamW on the masters; data-parallel replicas (DDP and ZeRO-1, real gloo ranks) equal;
resume exact through gpt2.train's checkpoints.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt2.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from gpt2.optim import MasterWeightAdamW, configure_optimizer
from gpt2_kernels.stochastic_round import stochastic_round_bf16
from gpt2.train import train
from tests.fixtures.train.tiny import final_params, read_metrics, single_thread, tiny_config  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def _float(bits: int) -> torch.Tensor:
    """The float32 of a 32-bit pattern (given unsigned, as written in hex)."""
    signed = bits - (1 << 32) if bits >= 1 << 31 else bits
    return torch.tensor([signed], dtype=torch.int32).view(torch.float32)


def _bits(x: torch.Tensor) -> int:
    return int(x.view(torch.int32)[0]) & 0xFFFFFFFF


def _is_bf16(x: torch.Tensor) -> bool:
    return torch.equal(x.to(torch.bfloat16).float(), x)


@pytest.mark.parametrize("bits, random16, expected", [
    (0x3F808000, 0x7FFF, 0x3F810000),  # 1 + half a bf16 ulp, low bits 0x8000 > 0x7FFF: up
    (0x3F808000, 0x8000, 0x3F800000),  # 0x8000 > 0x8000 is false: down
    (0xBF808000, 0x0000, 0xBF810000),  # negative: "up" is away from zero, as llm.c's bit arithmetic
    (0xBF80FFFF, 0xFFFF, 0xBF800000),  # 0xFFFF never exceeds 0xFFFF: towards zero
    (0x3C23D70A, 0x0000, 0x3C240000),  # 0.01: low bits 0xD70A
    (0x3F800000, 0x0000, 0x3F800000),  # already a bf16 value: unchanged whatever the draw
    (0x3FFFFFFF, 0x0000, 0x40000000),  # just below 2: rounding up carries into the exponent, giving 2.0
])
def test_rounding_matches_hand_computation(bits, random16, expected):
    x = _float(bits)
    out = stochastic_round_bf16(x, torch.tensor([random16], dtype=torch.int32))
    assert _bits(out) == expected, f"{bits:#010x} with {random16:#06x}: got {_bits(out):#010x}"
    assert _bits(x) == bits  # the input is not modified


def test_rounding_is_unbiased_and_bf16():
    """The mean over many draws is the float32 value (5 standard errors), where round-to-nearest is off by
    a whole fraction of an ulp; every output is one of the two bfloat16 neighbours."""
    draws = 200_000
    for value in (0.02 - 6e-6, -0.0137, 1.0 + 3e-3, 3.3e-5):
        x = torch.full((draws,), value, dtype=torch.float32)
        random16 = torch.randint(0, 1 << 16, (draws,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
        out = stochastic_round_bf16(x, random16)
        assert _is_bf16(out)
        down = _float(_bits(x[:1]) & ~0xFFFF)
        up = _float((_bits(x[:1]) & ~0xFFFF) + 0x10000)
        assert set(out.unique().tolist()) <= {float(down), float(up)}
        p = float((x[0] - down) / (up - down))
        stderr = float((up - down).abs()) * (p * (1 - p) / draws) ** 0.5
        assert abs(float(out.double().mean()) - value) < 5 * stderr + 1e-12, value
        nearest = float(x[:1].to(torch.bfloat16).float())
        assert abs(nearest - value) > 20 * stderr  # the test can tell rounding-to-nearest apart


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.LayerNorm(48), torch.nn.Linear(48, 8))
    with torch.no_grad():
        for p in model.parameters():  # a bf16 init, as the cross-check's llm.c model file gives
            p.copy_(p.to(torch.bfloat16).float())
    return model


def _grads(model: torch.nn.Module, step: int) -> None:
    g = torch.Generator().manual_seed(1000 + step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def test_masters_follow_plain_adamw_and_params_are_their_rounding():
    """The masters are exactly what torch's AdamW computes from the same gradients; the parameters are
    bf16 values within one bf16 ulp of them, written in place; the masters are in state_dict."""
    model, reference = _model(), _model()
    addresses = [p.data_ptr() for p in model.parameters()]
    optimizer = configure_optimizer(model, lr=1e-3, weight_decay=0.1, master_weights=True, seed=7)
    plain = configure_optimizer(reference, lr=1e-3, weight_decay=0.1, fused=True)  # the kernel the masters take
    for step in range(5):
        _grads(model, step)
        _grads(reference, step)
        optimizer.step()
        plain.step()
    assert [p.data_ptr() for p in model.parameters()] == addresses
    for p, ref in zip(model.parameters(), reference.parameters()):
        master = optimizer.state[p]["master"]
        assert torch.equal(master, ref.detach())
        assert _is_bf16(p.detach()) and not _is_bf16(master)
        ulp = (master.abs().view(torch.int32) & ~0xFFFF).view(torch.float32) / 128
        assert ((p.detach() - master).abs() <= ulp).all()
    saved = optimizer.state_dict()
    assert all("master" in s for s in saved["state"].values())
    assert saved["param_groups"][0]["rounding_step"] == 5


def test_warmup_update_reaches_the_forward_in_expectation():
    """llm.c's first update: 6e-6 on weights of 0.02, a twentieth of a bf16 ulp. Round-to-nearest (today's
    autocast) hides it entirely; the stochastically rounded parameters carry it on average."""
    weights = torch.nn.Parameter(torch.full((100_000,), 0.02).to(torch.bfloat16).float())
    start = weights.detach().clone()
    optimizer = MasterWeightAdamW([weights], lr=6e-6, weight_decay=0.0, rounding_seed=42)
    weights.grad = torch.ones_like(weights)
    optimizer.step()
    master = optimizer.state[weights]["master"]
    torch.testing.assert_close(master, start - 6e-6)
    assert torch.equal(master.to(torch.bfloat16).float(), start)  # what round-to-nearest would show
    torch.testing.assert_close(weights.detach().double().mean(), master.double().mean(), rtol=0, atol=3e-7)


def test_rounding_is_deterministic_per_seed_and_step():
    runs = {}
    for name, seed in (("a", 3), ("a_again", 3), ("b", 4)):
        model = _model()
        optimizer = configure_optimizer(model, lr=1e-3, weight_decay=0.1, master_weights=True, seed=seed)
        for step in range(2):
            _grads(model, step)
            optimizer.step()
        runs[name] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.equal(runs["a"], runs["a_again"])
    assert not torch.equal(runs["a"], runs["b"])  # another seed, other draws


def test_a_parameter_without_a_gradient_leaves_the_others_rounding_unchanged():
    """Element i of the master buffer rounds with the bits of (seed and step, i): when a parameter in the middle
    has no gradient (it is neither updated nor rounded), every other parameter ends exactly as in a step where
    all have one, and the one without keeps its value."""
    ends = {}
    for skipped in (None, 2):
        model = _model()
        optimizer = configure_optimizer(model, lr=1e-3, weight_decay=0.1, master_weights=True, seed=5)
        params = list(model.parameters())
        for step in range(2):
            _grads(model, step)
            if skipped is not None and step == 1:
                kept = params[skipped].detach().clone()
                params[skipped].grad = None
            optimizer.step()
        ends[skipped] = [p.detach().clone() for p in params]
    for i, (with_all, with_one_skipped) in enumerate(zip(ends[None], ends[2])):
        if i != 2:
            assert torch.equal(with_all, with_one_skipped), i
    assert torch.equal(ends[2][2], kept)


def _run(steps: int, piece: int | None = None, allocate_first: bool = False) -> list[torch.Tensor]:
    """The parameters and masters after `steps` steps; `piece`: elements rounded in one launch."""
    model = _model()
    optimizer = configure_optimizer(model, lr=1e-3, weight_decay=0.1, master_weights=True, seed=7)
    if piece is not None:
        optimizer.ROUNDING_PIECE = piece
    if allocate_first:
        optimizer.allocate_state()
    for step in range(steps):
        _grads(model, step)
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()] + \
        [optimizer.state[p]["master"].clone() for p in model.parameters()]


@pytest.mark.parametrize("piece", [1, 100, 3072])
def test_rounding_in_pieces_gives_the_bits_of_one_launch(piece):
    """The rounding runs over pieces of whole parameters (a piece of 1 element: each parameter alone; 3072: the
    first matrix alone, then the rest together), each at its offset: the same parameters, bit for bit, as one
    launch over the whole buffer."""
    whole = _run(3, piece=2**40)
    for a, b in zip(whole, _run(3, piece=piece)):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_on_cuda_the_rounding_writes_the_parameters_straight_from_the_masters():
    """On CUDA one launch rounds the masters into the parameters (gpt2_kernels.stochastic_round.RoundInto): each
    parameter holds its slice of one launch over the whole buffer, bit for bit, also when a parameter has no
    gradient; a step after the first allocates no rounded copy (the piece the CPU path makes, 4 bytes an element
    of its largest parameter), only the table made again for the parameters updated."""
    import numpy as np

    from gpt2_kernels.stochastic_round import _round_triton

    model = _model().cuda()
    params = list(model.parameters())
    optimizer = configure_optimizer(model, lr=1e-3, weight_decay=0.1, master_weights=True, seed=7)
    optimizer.allocate_state()
    for step in range(3):
        for p, g in zip(params, _grads_of(model, step)):
            p.grad = g.cuda()
        if step == 2:
            params[2].grad = None
            kept = params[2].detach().clone()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        optimizer.step()
        torch.cuda.synchronize()
        if step == 1:  # the table was made by allocate_state: nothing but AdamW's own few bytes
            assert torch.cuda.max_memory_allocated() - before < 4 * params[0].numel()
        seed = int(np.random.SeedSequence([7, step]).generate_state(1)[0])
        whole = _round_triton(optimizer._flat_masters, seed, 0)
        offsets = optimizer._offsets
        for i, p in enumerate(params):
            expected = kept if (step == 2 and i == 2) else whole[offsets[p]:offsets[p] + p.numel()].view_as(p)
            assert torch.equal(p.detach(), expected), (step, i)


def _grads_of(model: torch.nn.Module, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=g) for p in model.parameters()]


def test_pieces_cover_every_parameter_once_within_the_limit():
    from gpt2.optim import _contiguous_runs

    params = [torch.zeros(n) for n in (5, 3, 4, 9, 2)]
    offsets = dict(zip(params, (0, 5, 8, 12, 21)))
    runs = _contiguous_runs(params, offsets, max_elements=8)
    assert [[int(p.numel()) for p in run] for _, run in runs] == [[5, 3], [4], [9], [2]]
    assert [start for start, _ in runs] == [0, 8, 12, 21]
    # a parameter without a gradient splits a piece where it is missing
    runs = _contiguous_runs([params[0], params[2]], offsets, max_elements=100)
    assert [start for start, _ in runs] == [0, 8]


def test_state_allocated_before_the_first_step_changes_nothing():
    """allocate_state (called before a CUDA graph is captured) makes the masters and moments the first step would
    make: the run is the same bit for bit, and the state exists, zeroed, before any step."""
    model = _model()
    optimizer = configure_optimizer(model, lr=1e-3, weight_decay=0.1, master_weights=True, seed=7)
    optimizer.allocate_state()
    for p in model.parameters():
        state = optimizer.state[p]
        assert torch.equal(state["master"], p.detach()) and not state["exp_avg"].any() and state["step"] == 0
    for a, b in zip(_run(3), _run(3, allocate_first=True)):
        assert torch.equal(a, b)


def test_masters_loaded_into_state_directly_are_used():
    """ZeRO-1 loads a checkpoint by writing each owned parameter's state itself, not through load_state_dict:
    the optimizer must update the masters it finds there, not its earlier buffer."""
    model = _model()
    optimizer = configure_optimizer(model, lr=1e-3, weight_decay=0.1, master_weights=True, seed=1)
    _grads(model, 0)
    optimizer.step()
    p = next(model.parameters())
    planted = {k: v.clone() for k, v in optimizer.state[p].items()}
    planted["master"] = planted["master"] + 0.5
    optimizer.state[p] = planted
    expected = planted["master"].clone()
    reference = torch.optim.AdamW([torch.nn.Parameter(expected)], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                                  fused=True)
    reference.state[reference.param_groups[0]["params"][0]] = {k: v.clone() for k, v in planted.items() if k != "master"}
    _grads(model, 1)
    reference.param_groups[0]["params"][0].grad = p.grad.clone()
    optimizer.step()
    reference.step()
    assert torch.equal(optimizer.state[p]["master"], reference.param_groups[0]["params"][0].detach())


def test_state_dict_round_trip_resumes_exactly():
    """Stop after 3 of 6 steps, rebuild model and optimizer from their state dicts, finish: bit for bit the
    uninterrupted run."""
    model = _model()
    optimizer = configure_optimizer(model, lr=1e-3, weight_decay=0.1, master_weights=True, seed=1)
    for step in range(3):
        _grads(model, step)
        optimizer.step()
    saved_model, saved_optimizer = model.state_dict(), optimizer.state_dict()
    saved_model = {k: v.clone() for k, v in saved_model.items()}
    saved_optimizer = {"state": {i: {k: v.clone() for k, v in s.items()} for i, s in saved_optimizer["state"].items()},
                       "param_groups": saved_optimizer["param_groups"]}
    for step in range(3, 6):
        _grads(model, step)
        optimizer.step()

    resumed = _model(seed=99)
    resumed.load_state_dict(saved_model)
    resumed_optimizer = configure_optimizer(resumed, lr=1e-3, weight_decay=0.1, master_weights=True, seed=1)
    resumed_optimizer.load_state_dict(saved_optimizer)
    for step in range(3, 6):
        _grads(resumed, step)
        resumed_optimizer.step()
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(optimizer.state[p]["master"], resumed_optimizer.state[q]["master"])


def test_train_default_follows_the_compute_dtype(tmp_path):
    """On by default where the forward computes in bf16, off in float32; the resolved choice is recorded."""
    for dtype, expected in (("bfloat16", True), ("float32", False)):
        config = tiny_config(tmp_path / dtype, dtype=dtype, max_steps=2)
        train(config)
        resolved = json.loads((Path(config.out_dir) / "config.json").read_text())["resolved"]
        assert resolved["master_weights"] is expected, dtype
        params = final_params(config.out_dir)
        assert all(_is_bf16(v) for v in params.values()) is expected, dtype
    off = tiny_config(tmp_path / "off", dtype="bfloat16", master_weights=False, max_steps=2)
    train(off)
    assert not all(_is_bf16(v) for v in final_params(off.out_dir).values())


def test_train_resume_with_master_weights_is_exact(tmp_path):
    """gpt2.train in bf16 (master weights by default): a run resumed from its step-2 checkpoint ends bit
    for bit like the uninterrupted one; the checkpoints carry the masters in the optimizer state."""
    full = tiny_config(tmp_path / "full", dtype="bfloat16", max_steps=4, checkpoint_every=1, keep_last=4)
    train(full)
    state = load_checkpoint(latest_checkpoint(full.out_dir))
    assert all("master" in s for s in state["optimizer"]["state"].values())

    cut = tiny_config(tmp_path / "cut", dtype="bfloat16", max_steps=2, checkpoint_every=1, keep_last=4)
    train(cut)
    train(tiny_config(tmp_path / "cut", dtype="bfloat16", max_steps=4, checkpoint_every=1, keep_last=4))
    assert [r["loss"] for r in read_metrics(cut.out_dir)] == [r["loss"] for r in read_metrics(full.out_dir)]
    for name, value in final_params(full.out_dir).items():
        assert torch.equal(final_params(cut.out_dir)[name], value), name
    assert [s for s, _ in list_checkpoints(cut.out_dir)] == [s for s, _ in list_checkpoints(full.out_dir)]


REPLICA_SCRIPT = """
import copy, json, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from gpt2.config import GPTConfig
from gpt2.distributed import setup, teardown
from gpt2.model import GPT
from gpt2.optim import configure_optimizer, full_state_dict, load_full_state_dict
from tests.fixtures.train.threads import baseline_thread_count, thread_count

threads_before = baseline_thread_count()
setup("cpu")  # as gpt2.train starts and ends its process group
rank, zero1 = dist.get_rank(), sys.argv[2] == "zero1"

def build():
    model = GPT.create(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64))
    optimizer = configure_optimizer(model, lr=1e-3, weight_decay=0.1, zero1=zero1, master_weights=True, seed=5)
    return model, DDP(model), optimizer

def train(ddp, optimizer, steps):
    for step in steps:  # each rank its own batch: only the all-reduce makes the updates equal
        idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(100 * step + rank))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = ddp(idx, idx)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

def main():  # in a function, as gpt2.train: nothing that holds the process group outlives it
    model, ddp, optimizer = build()
    train(ddp, optimizer, range(2))
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_optimizer = copy.deepcopy(full_state_dict(optimizer))  # the live state goes on changing
    dist.broadcast_object_list(box := [saved_optimizer], src=0)
    train(ddp, optimizer, range(2, 4))

    resumed, resumed_ddp, resumed_optimizer = build()
    resumed.load_state_dict(saved)
    load_full_state_dict(resumed_optimizer, box[0])
    train(resumed_ddp, resumed_optimizer, range(2, 4))

    inner = optimizer.optim if zero1 else optimizer
    masters = sum(s["master"].numel() for s in inner.state.values())
    torch.save({"params": torch.cat([p.detach().flatten() for p in model.parameters()]),
                "resumed": torch.cat([p.detach().flatten() for p in resumed.parameters()]),
                "masters": masters, "numel": sum(p.numel() for p in model.parameters())}, f"{sys.argv[1]}/rank{rank}.pt")


main()
teardown()  # joins the group's gloo threads: one left running may be killed mid-destructor at exit
with open(f"{sys.argv[1]}/rank{rank}.threads", "w") as f:
    f.write(str(thread_count() - threads_before))
"""


@pytest.mark.parametrize("mode", ["ddp", "zero1"])
def test_replicas_stay_equal_and_resume_exactly(tmp_path, mode):
    """2 real gloo ranks, each on its own batches: the bf16 parameters are equal on both ranks after every
    update's rounding, and a rebuild from the consolidated optimizer state continues bit for bit. Under
    ZeRO-1 each rank keeps the masters of the parameters it owns: together, each master once."""
    script = tmp_path / "replicas.py"
    script.write_text(REPLICA_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           str(tmp_path), mode]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert [(tmp_path / f"rank{r}.threads").read_text() for r in range(2)] == ["0", "0"], "threads outlive teardown"
    assert torch.equal(ranks[0]["params"], ranks[1]["params"])
    assert _is_bf16(ranks[0]["params"])
    for r in ranks:
        assert torch.equal(r["resumed"], r["params"])
    held = [r["masters"] for r in ranks]
    numel = ranks[0]["numel"]
    if mode == "zero1":
        assert sum(held) == numel and all(0 < h < numel for h in held)
    else:
        assert held == [numel, numel]
