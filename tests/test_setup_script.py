"""scripts/setup.sh's choice of what to install, by the GPU it finds: the CPU build of torch without a GPU, the
`gpu` extra (FlashAttention-4, quack-kernels) where an NVIDIA Hopper GPU is present, neither on other GPUs.
A stand-in nvidia-smi on PATH answers as the driver's does, and a stand-in interpreter in the virtual
environment records the pip commands instead of installing."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _setup(tmp_path: Path, compute_cap: str | None) -> tuple[str, list[str]]:
    """Runs setup.sh against a stand-in venv; returns its output and the pip commands it ran."""
    venv, bin_dir, calls = tmp_path / "venv", tmp_path / "bin", tmp_path / "pip_calls"
    _executable(venv / "bin" / "python", f'#!/bin/sh\necho "$*" >> {calls}\n')
    path = [str(bin_dir)] + [d for d in os.environ["PATH"].split(os.pathsep)
                             if not (Path(d) / "nvidia-smi").exists()]
    if compute_cap is not None:  # `nvidia-smi --query-gpu=compute_cap --format=csv,noheader`, one line a GPU
        _executable(bin_dir / "nvidia-smi", f'#!/bin/sh\ncase "$*" in *compute_cap*) printf "{compute_cap}\\n{compute_cap}\\n";; esac\n')
    else:
        bin_dir.mkdir(exist_ok=True)
    result = subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "VENV": str(venv), "PATH": os.pathsep.join(path)})
    assert result.returncode == 0, result.stderr
    return result.stdout, calls.read_text().splitlines()


@pytest.mark.parametrize("compute_cap, torch_cpu, extras", [
    (None, True, ".[test]"),        # no GPU: the CPU build of torch first, never the CUDA wheels
    ("8.0", False, ".[test]"),      # an A100: CUDA torch from the index, no gpu extra (its kernels need Hopper)
    ("9.0", False, ".[test,gpu]"),  # an H100 or H200: the fast path, and setup says so
])
def test_setup_installs_the_gpu_extra_on_hopper_only(tmp_path, compute_cap, torch_cpu, extras):
    out, calls = _setup(tmp_path, compute_cap)
    assert any("torch==" in c for c in calls) == torch_cpu, calls
    installs = [c.split()[-1] for c in calls if " -e " in f" {c} "]
    assert installs == [extras], calls
    assert ("Hopper GPU" in out) == (extras == ".[test,gpu]"), out
    # a second run with nothing changed installs nothing
    again, calls_again = _setup(tmp_path, compute_cap)
    assert calls_again == calls, calls_again
