"""DDP on CPU (gloo): 2 ranks x B=2 train exactly like 1 rank x B=4 (real torchrun processes)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from gpt2.train import train
from tests.fixtures.train.tiny import single_thread  # noqa: F401 (autouse fixture)
from tests.fixtures.train.tiny import (
    TINY_GPT2_VOCAB_MODEL, final_params, read_metrics, tiny_config, write_hellaswag_file,
)


@pytest.mark.slow
def test_two_ranks_b2_equal_one_rank_b4(tmp_path):
    # file order: llm.c's order gives each rank its own permutation, so 2 ranks read other samples than 1
    evals = dict(model=TINY_GPT2_VOCAB_MODEL, max_steps=3, val_every=3, val_steps=2, hellaswag_every=3,
                 hellaswag=str(write_hellaswag_file(tmp_path / "hellaswag.bin", n_examples=7)), train_order="file")
    one = tiny_config(tmp_path / "one", batch_size=4, total_batch_size=64, **evals)
    two = tiny_config(tmp_path / "two", batch_size=2, total_batch_size=64, **evals)
    train(one)

    config_file = tmp_path / "two.json"
    config_file.write_text(json.dumps(two.to_dict()))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "gpt2.train", "--config", str(config_file)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr

    resolved = json.loads((tmp_path / "two" / "run" / "config.json").read_text())["resolved"]
    assert (resolved["world_size"], resolved["grad_accum_steps"]) == (2, 1)
    # only rank 0 logs: one record per step
    losses_one = [r["loss"] for r in read_metrics(one.out_dir)]
    losses_two = [r["loss"] for r in read_metrics(two.out_dir)]
    assert len(losses_two) == 3
    torch.testing.assert_close(torch.tensor(losses_two), torch.tensor(losses_one), rtol=1e-6, atol=1e-6)
    # val: per batch, ranks 0 and 1 read the two halves of what the single rank reads
    val_one, val_two = read_metrics(one.out_dir, "val")[-1], read_metrics(two.out_dir, "val")[-1]
    assert abs(val_one["val_loss"] - val_two["val_loss"]) < 1e-5
    # HellaSwag: rank 0 scores examples 0, 2, 4, 6 and rank 1 the rest; counts are summed over ranks
    hs_one, hs_two = read_metrics(one.out_dir, "hellaswag")[-1], read_metrics(two.out_dir, "hellaswag")[-1]
    assert hs_one["n"] == hs_two["n"] == 7
    assert (hs_two["correct"], hs_two["correct_norm"]) == (hs_one["correct"], hs_one["correct_norm"])
    params_one, params_two = final_params(one.out_dir), final_params(two.out_dir)
    for name, value in params_one.items():
        torch.testing.assert_close(params_two[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_setup_on_a_gpu_sets_the_rank_device_first(monkeypatch):
    """setup() on a CUDA rank (faked here: no GPU on this machine) selects the rank's device before anything
    else. A function-local `import torch.distributed.optim` once made `torch` a local name of setup(), so on
    every GPU, one process or many, training died at `torch.cuda.set_device` with UnboundLocalError."""
    import gpt2.distributed as distributed

    selected = []
    monkeypatch.setattr(distributed, "resolve_device", lambda device, local_rank=0: torch.device("cuda", local_rank))
    monkeypatch.setattr(torch.cuda, "set_device", selected.append)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    ctx = distributed.setup("cuda")
    assert ctx.device == torch.device("cuda", 0) and ctx.world_size == 1
    assert selected == [torch.device("cuda", 0)]


@pytest.mark.parametrize("user_setting", [None, "expandable_segments:False", "alloc-conf:backend:native"])
def test_setup_on_a_gpu_configures_the_allocator_before_cuda_starts(monkeypatch, user_setting):
    """setup() on a CUDA rank (faked) turns on expandable segments before the device is first touched, as
    PyTorch reads the setting then; a setting of the user's, under either variable's name, is kept."""
    import gpt2.distributed as distributed

    env_at_set_device = []
    monkeypatch.setattr(distributed, "resolve_device", lambda device, local_rank=0: torch.device("cuda", local_rank))
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda dev: env_at_set_device.append({k: os.environ.get(k) for k in distributed.ALLOCATOR_ENV}))
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", *distributed.ALLOCATOR_ENV):
        monkeypatch.delenv(name, raising=False)
    if user_setting is None:
        expected = {"PYTORCH_ALLOC_CONF": None, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    elif user_setting.startswith("alloc-conf:"):
        monkeypatch.setenv("PYTORCH_ALLOC_CONF", user_setting.removeprefix("alloc-conf:"))
        expected = {"PYTORCH_ALLOC_CONF": "backend:native", "PYTORCH_CUDA_ALLOC_CONF": None}
    else:
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", user_setting)
        expected = {"PYTORCH_ALLOC_CONF": None, "PYTORCH_CUDA_ALLOC_CONF": user_setting}
    distributed.setup("cuda")
    assert env_at_set_device == [expected]


def test_setup_on_the_cpu_leaves_the_allocator_alone(monkeypatch):
    import gpt2.distributed as distributed

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", *distributed.ALLOCATOR_ENV):
        monkeypatch.delenv(name, raising=False)
    distributed.setup("cpu")
    assert not any(os.environ.get(name) for name in distributed.ALLOCATOR_ENV)


@pytest.mark.gpu
@pytest.mark.parametrize("user_setting, segments", [(None, 1), ("expandable_segments:False", 2)])
def test_allocator_setting_takes_effect_on_gpu(user_setting, segments):
    """In a fresh process, as `python -m gpt2.train` starts: after setup(), two large allocations share one
    expandable segment; with the user's own setting each gets a segment of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    if user_setting:
        env["PYTORCH_CUDA_ALLOC_CONF"] = user_setting
    probe = ("import torch; from gpt2.distributed import setup; setup('cuda'); "
             "a, b = (torch.empty(1 << 28, device='cuda') for _ in range(2)); "
             "print(sum(s['segment_type'] == 'large' for s in torch.cuda.memory_snapshot()))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) == segments


@pytest.mark.slow
def test_graph_step_averages_gradients_over_ranks_as_ddp_does():
    """With CUDA graphs, the model is not DDP-wrapped: MicroStepGraph's FlatGradients averages the gradients
    over the ranks itself. Two real gloo ranks, two steps of two micro-batches each: every gradient equals
    DDP's bit for bit, in the second step too (the buffer is zeroed and handed back, not summed on)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tests.fixtures.train.graph_gradients_rank"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    steps = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [s["step"] for s in steps] == [0, 1]
    for s in steps:
        differ = [name for name, equal in s["equal"].items() if not equal]
        assert not differ, f"step {s['step']}: gradients differ from DDP's: {differ}"
