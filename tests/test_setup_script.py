"""scripts/setup.sh's choice of what to install, by the GPU it finds: the CPU build of torch without a GPU, the
`gpu` extra (FlashAttention-4, quack-kernels) where an NVIDIA Hopper GPU is present, neither on other GPUs.
A stand-in nvidia-smi on PATH answers as the driver's does, and a stand-in interpreter in the virtual
environment records the pip commands instead of installing (a stand-in uv, there too, its commands). The
installer: pip, or uv where asked (INSTALLER=uv, as scripts/test.sh does), pip again where uv fails."""

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


def _setup(tmp_path: Path, compute_cap: str | None, installer: str | None = None,
           uv_exit: int = 0) -> tuple[str, list[str]]:
    """Runs setup.sh against a stand-in venv; returns its output and the pip (and uv) commands it ran."""
    venv, bin_dir, calls = tmp_path / "venv", tmp_path / "bin", tmp_path / "pip_calls"
    _executable(venv / "bin" / "python", f'#!/bin/sh\necho "$*" >> {calls}\n')
    _executable(venv / "bin" / "uv", f'#!/bin/sh\necho "uv $*" >> {calls}\nexit {uv_exit}\n')
    path = [str(bin_dir)] + [d for d in os.environ["PATH"].split(os.pathsep)
                             if not (Path(d) / "nvidia-smi").exists()]
    if compute_cap is not None:  # `nvidia-smi --query-gpu=compute_cap --format=csv,noheader`, one line a GPU
        _executable(bin_dir / "nvidia-smi", f'#!/bin/sh\ncase "$*" in *compute_cap*) printf "{compute_cap}\\n{compute_cap}\\n";; esac\n')
    else:
        bin_dir.mkdir(exist_ok=True)
    result = subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "VENV": str(venv), "PATH": os.pathsep.join(path),
                                 **({"INSTALLER": installer} if installer else {})})
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr, calls.read_text().splitlines()


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


def test_setup_installs_the_project_with_uv_where_asked_and_with_pip_where_uv_fails(tmp_path):
    out, calls = _setup(tmp_path / "uv", None, installer="uv")
    venv_python = tmp_path / "uv" / "venv" / "bin" / "python"
    assert calls[0].endswith("torch==2.13.0"), calls  # the CPU build still through pip, which knows where it lies
    assert calls[1:] == ["-m pip install --disable-pip-version-check -q uv",
                         f"uv pip install --quiet --python {venv_python} --compile-bytecode -e .[test]"], calls
    assert "with uv" in out, out

    out, calls = _setup(tmp_path / "uv-fails", None, installer="uv", uv_exit=2)
    assert calls[-2].startswith("uv pip install") and calls[-1].endswith("-q -e .[test]"), calls
    assert "uv could not install the project: installing it with pip" in out, out


def test_setup_refuses_an_unknown_installer_naming_it(tmp_path):
    result = subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "VENV": str(tmp_path / "venv"), "INSTALLER": "conda"})
    assert result.returncode == 2 and "INSTALLER=conda: must be pip or uv" in result.stderr, result
    assert not (tmp_path / "venv").exists()
