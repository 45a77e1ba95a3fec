"""What the environment holds agrees with what the project says: the Prefect version pyproject.toml pins is
the one installed and the one prefect.yaml names, and the test dependencies print nothing into a user's
process that imports them (transformers is the reference the docs show loading an export)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def _prefect_requirement() -> str:
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (requirement,) = [d for d in dependencies if re.match(r"prefect\b", d)]
    return requirement


def test_the_prefect_version_pinned_is_installed_and_named_by_the_deployment_file():
    installed = version("prefect")
    assert _prefect_requirement() == f"prefect=={installed}", \
        f"pyproject.toml says {_prefect_requirement()!r}, the environment has prefect {installed}"
    deployment_file = yaml.safe_load((REPO / "prefect.yaml").read_text())
    assert deployment_file["prefect-version"] == installed


def test_importing_transformers_prints_nothing():
    result = subprocess.run([sys.executable, "-c", "from transformers import AutoTokenizer, GPT2LMHeadModel"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stderr == "" and result.stdout == "", result.stderr[-3000:]
