"""Loading a checkpoint cannot run code: state.safetensors + state.json, nothing unpickled.

A state.pt that runs `touch MARKER` when unpickled (its COMPLETE marker's sha256 matching) is planted where
the pipeline loads checkpoints from -- `--init-from`, a run's resume checkpoint, evaluate/sample's
`--checkpoint`, and the conversion command itself -- through the real CLIs: each refuses it and the
marker never appears. A genuine checkpoint of the older format converts to one that loads to the same
tensors, optimizer and RNG states.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

import gpt2.checkpoint as ckpt
from gpt2.config import parse_model_spec
from gpt2.model import GPT
from gpt2.run_dir import RunDir
from tests.fixtures.pickled import plant_malicious_checkpoint, write_pickled_checkpoint
from tests.fixtures.train.tiny import TINY_MODEL, single_thread, tiny_config  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parent.parent


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def _train_command(tmp_path: Path, **overrides) -> list[str]:
    config = tmp_path / "run.json"
    config.write_text(json.dumps(tiny_config(tmp_path, **overrides).to_dict()))
    return ["-m", "gpt2.train", "--config", str(config)]


def test_a_planted_pickled_checkpoint_runs_no_code_wherever_it_is_loaded_from(tmp_path):
    marker = tmp_path / "code-ran"
    bad = plant_malicious_checkpoint(tmp_path / "planted" / "checkpoints" / "step_00000005", marker)
    refused = f"{bad} holds state.pt, the older pickled checkpoint format, which is not loaded"

    as_init = _cli(*_train_command(tmp_path, init_from=str(bad)))
    resume_dir = tmp_path / "resumed"
    shutil.copytree(bad, RunDir(resume_dir).checkpoint(5))
    as_resume = _cli(*_train_command(tmp_path, out_dir=str(resume_dir)))
    as_eval = _cli("-m", "gpt2.evaluate", "--checkpoint", str(bad), "--val-data", str(tmp_path / "shards/*_val_*"))
    as_sample = _cli("-m", "gpt2.sample", "--checkpoint", str(bad.parent.parent), "--prompt", "Hi")
    conversion = _cli("-m", "gpt2.checkpoint", "convert", str(bad))

    assert not marker.exists(), "a checkpoint's state.pt ran code when loaded"
    for name, result in dict(init_from=as_init, evaluate=as_eval, sample=as_sample).items():
        assert result.returncode != 0 and refused in result.stderr, (name, result.stderr[-2000:])
    assert as_resume.returncode != 0 and "convert it once with `python -m gpt2.checkpoint convert" in as_resume.stderr
    assert conversion.returncode != 0 and "state.pt: refused, it holds more than tensors" in conversion.stderr
    assert (bad / "state.pt").exists() and not (bad / ckpt.TENSORS_FILE).exists()  # left as it was


def test_an_older_pickled_checkpoint_converts_to_the_same_state(tmp_path):
    """The conversion command reads a genuine state.pt (weights_only, NumPy's RNG arrays allowed) and writes
    the same model, optimizer and RNG states in the current format."""
    config = parse_model_spec(TINY_MODEL)
    model = GPT.create(config, seed=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    x = torch.randint(0, 256, (2, 8))
    model(x, x)[1].backward()
    optimizer.step()
    random.seed(5), np.random.seed(6), torch.manual_seed(7)
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    state = {"step": 9, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": [rng],
             "loader": [{"epoch": 0, "shard_pos": 0, "sample_pos": 3}], "model_config": asdict(config)}
    path = tmp_path / "run" / "checkpoints" / "step_00000009"
    write_pickled_checkpoint(path, state, b"\0" * 8, step=9)
    with pytest.raises(ckpt.CheckpointError, match="python -m gpt2.checkpoint convert"):
        ckpt.load_checkpoint(path)

    result = _cli("-m", "gpt2.checkpoint", "convert", str(path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in path.iterdir()) == ["COMPLETE", "model.bin", "state.json", "state.safetensors"]
    loaded = ckpt.load_checkpoint(path)
    assert all(torch.equal(loaded["model"][k], v) for k, v in model.state_dict().items())
    restored = torch.optim.AdamW(GPT.create(config, seed=0).parameters())
    restored.load_state_dict(loaded["optimizer"])
    for k, v in optimizer.state_dict()["state"].items():
        assert all(torch.equal(restored.state_dict()["state"][k][n], v[n]) for n in v)
    assert restored.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]
    assert loaded["loader"] == state["loader"]
    ckpt.restore_rng_state(loaded["rng"][0])
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(5), np.random.seed(6), torch.manual_seed(7)
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


def _state_with_views(device: str) -> tuple[dict, GPT]:
    """A model's state and, as MasterWeightAdamW keeps its master weights, views into one flat buffer."""
    config = parse_model_spec(TINY_MODEL)
    model = GPT.create(config, seed=5).to(device)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]) + 1
    sizes = [p.numel() for p in model.parameters()]
    masters = [view.view_as(p) for view, p in zip(flat.split(sizes), model.parameters())]
    return {"step": 1, "model": model.state_dict(), "model_config": asdict(config),
            "optimizer": {"flat": flat, "masters": masters}}, model


def test_views_into_one_buffer_are_saved_with_their_values(tmp_path):
    state, model = _state_with_views("cpu")
    loaded = ckpt.load_checkpoint(ckpt.save_checkpoint(tmp_path, 1, state, model))
    assert torch.equal(loaded["optimizer"]["flat"], state["optimizer"]["flat"])
    for saved, view in zip(loaded["optimizer"]["masters"], state["optimizer"]["masters"], strict=True):
        assert torch.equal(saved, view)


@pytest.mark.gpu
def test_saving_views_into_one_gpu_buffer_takes_no_gpu_memory(tmp_path):
    """The views are copied to host memory for the writer: at 1.5B parameters a copy of the masters on the GPU
    took 6.2 GB there at the last step."""
    state, model = _state_with_views("cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    held = torch.cuda.memory_allocated()
    path = ckpt.save_checkpoint(tmp_path, 1, state, model)
    assert torch.cuda.max_memory_allocated() == held
    loaded = ckpt.load_checkpoint(path)
    for saved, view in zip(loaded["optimizer"]["masters"], state["optimizer"]["masters"], strict=True):
        assert torch.equal(saved, view.cpu())
