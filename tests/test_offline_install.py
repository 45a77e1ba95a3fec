"""The install on a host without a package registry (docs/gpu-run.md), run as the docs write it.

The host is a fresh virtual environment layered on an "image": every package of this checkout's .venv
except the project itself, as a GPU host's image brings torch and the rest. The wheelhouse holds the
project's wheel, built from the committed tree. The documented command must install the project from it
with no index, so that the project imports and runs outside the repository, with every requirement met.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "gpu-run.md"
SECTION = "## Installing on a host without a package registry"


def documented_host_install() -> str:
    """The `pip install --no-index` line of the guide's install section."""
    text = GUIDE.read_text(encoding="utf-8")
    assert SECTION in text, f"{GUIDE.name} has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    lines = [line for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S) for line in block.splitlines()
             if "pip install --no-index" in line]
    assert len(lines) == 1, f"one host install command expected in {SECTION!r}, found {lines}"
    return lines[0]


def image_site(venv: Path, out: Path) -> Path:
    """A folder with every distribution installed in `venv` except this project (links; metadata copied,
    which pip does not read through a link)."""
    site = next((venv / "lib").glob("python3*/site-packages"))
    out.mkdir()
    for entry in site.iterdir():
        if entry.name.startswith(("gpt2_pretrain", "__editable__")) or entry.suffix == ".pth":
            continue
        if entry.name.endswith(".dist-info"):
            shutil.copytree(entry, out / entry.name)
        else:
            os.symlink(entry.resolve(), out / entry.name)
    return out


@pytest.fixture
def host(tmp_path_factory) -> dict[str, str]:
    """The environment of a shell on a fresh host: its venv's python3 first on the PATH, no index reachable."""
    root = tmp_path_factory.mktemp("host")
    venv = root / "venv"
    # without its own pip and setuptools: the image's (newer) ones serve, as on a host whose image has them
    subprocess.run([os.path.realpath(REPO / ".venv" / "bin" / "python3"), "-m", "venv", "--without-pip", str(venv)],
                   check=True)
    layer = image_site(REPO / ".venv", root / "image")
    purelib = subprocess.run([str(venv / "bin" / "python3"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "zz-image.pth").write_text(f"{layer}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    # an unreachable index: a command that forgot --no-index fails instead of finding a registry
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", PIP_INDEX_URL="http://127.0.0.1:9/simple",
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_CONFIG_FILE=os.devnull)
    return env


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    """The committed tree, with `wheelhouse/` holding the project's wheel (built offline)."""
    path = tmp_path_factory.mktemp("repo") / "gpt2"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(path)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(path / "wheelhouse"), str(path)], check=True)
    return path


def sh(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_documented_offline_install_runs_the_project_outside_the_repository(host, repository, tmp_path):
    install = sh(documented_host_install(), repository, host)
    assert install.returncode == 0, install.stdout + install.stderr

    # outside the repository, only the installed copy can answer
    where = sh("python3 -c 'import gpt2, flows.pipeline, kernels, data.tokenizer; print(gpt2.__file__)'", tmp_path, host)
    assert where.returncode == 0, where.stderr
    assert "/site-packages/gpt2/" in where.stdout and str(repository) not in where.stdout
    train_help = sh("python3 -m gpt2.train --help", tmp_path, host)
    assert train_help.returncode == 0 and "--max-steps" in train_help.stdout, train_help.stderr
    check = sh("python3 -m pip check", tmp_path, host)  # every requirement of every installed package met
    assert check.returncode == 0, check.stdout + check.stderr


def test_offline_install_without_the_projects_wheel_fails_naming_it(host, repository, tmp_path):
    empty = tmp_path / "repo"
    shutil.copytree(repository, empty, ignore=shutil.ignore_patterns("*.whl"))
    install = sh(documented_host_install(), empty, host)
    assert install.returncode != 0
    assert "No matching distribution found for gpt2-pretrain" in install.stderr, install.stderr
