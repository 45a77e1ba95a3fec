"""A full disk while writing a checkpoint: named at once (path, bytes needed, bytes free), nothing half-written,
the previous checkpoint intact and the newest that verifies (the resume point) -- on a real filesystem that fills up (a small tmpfs; root only).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpt2.checkpoint as ckpt
from common.files import TMP_DIR_PREFIX
from gpt2.run_dir import RunDir
from tests.fixtures.train.tiny import single_thread, tiny_config  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parent.parent
DISK_FULL = re.compile(r"no space left on (\S+): ([\d,]+) bytes needed, ([\d,]+) free")


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs mounted for the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def _train(tmp_path: Path, out_dir: Path, max_steps: int) -> subprocess.CompletedProcess:
    config = tmp_path / f"run{max_steps}.json"
    config.write_text(json.dumps(tiny_config(tmp_path, out_dir=str(out_dir), max_steps=max_steps,
                                             checkpoint_every=2).to_dict()))
    return subprocess.run([sys.executable, "-m", "gpt2.train", "--config", str(config)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_a_full_disk_fails_the_checkpoint_at_once_naming_it_and_the_previous_one_stays(tmp_path, small_disk):
    out_dir = small_disk / "run"
    first = _train(tmp_path, out_dir, max_steps=2)
    assert first.returncode == 0, first.stderr[-2000:]
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (shutil.disk_usage(small_disk).free - 64 * 1024))  # 64 KiB left: less than a checkpoint

    full = _train(tmp_path, out_dir, max_steps=4)
    assert full.returncode != 0
    found = DISK_FULL.search(full.stderr)
    assert found, full.stderr[-3000:]
    path, needed, free = found.group(1), int(found.group(2).replace(",", "")), int(found.group(3).replace(",", ""))
    assert path == str(RunDir(out_dir).checkpoint(4)) and needed > free
    assert [step for step, _ in ckpt.list_checkpoints(out_dir)] == [2]  # nothing half-written, step 2 intact
    ckpt.verify_checkpoint(RunDir(out_dir).checkpoint(2))
    assert not list(RunDir(out_dir).checkpoints.glob(f"{TMP_DIR_PREFIX}*"))
