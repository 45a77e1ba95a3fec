"""A full disk, named by every writer at once (path, bytes needed, bytes free) with nothing half-written: a
checkpoint (the previous one stays intact and the resume point), metrics.jsonl and TensorBoard events during
training (one error line, no writer thread's traceback; the rerun resumes), config.json, the loss curve, a
Hugging Face export, a hub download (checked against the listed sizes before the first byte) -- on a real
filesystem that fills up (a small tmpfs; root only).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpt2.checkpoint as ckpt
from common.files import TMP_DIR_PREFIX
from gpt2.run_dir import RunDir
from tests.fixtures.processes import wait_for
from tests.fixtures.train.tiny import single_thread, tiny_config  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parent.parent
DISK_FULL = re.compile(r"no space left on (\S+): ([\d,]+) bytes needed, ([\d,]+) free")


@contextlib.contextmanager
def tmpfs(folder: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at `folder` with `options` (its size, inodes) for the block."""
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs mounted for the test."""
    with tmpfs(tmp_path / "disk", "size=8m") as disk:
        yield disk


def _train_command(tmp_path: Path, out_dir: Path, max_steps: int, checkpoint_every: int = 2) -> list[str]:
    config = tmp_path / f"run{max_steps}.json"
    config.write_text(json.dumps(tiny_config(tmp_path, out_dir=str(out_dir), max_steps=max_steps,
                                             checkpoint_every=checkpoint_every).to_dict()))
    return [sys.executable, "-m", "gpt2.train", "--config", str(config)]


def _train(tmp_path: Path, out_dir: Path, max_steps: int) -> subprocess.CompletedProcess:
    return subprocess.run(_train_command(tmp_path, out_dir, max_steps), cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def fill(disk: Path) -> Path:
    """Fill `disk` to its last byte; returns the filler file (delete it to free the space)."""
    filler = disk / f"filler{len(list(disk.glob('filler*')))}"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
        except OSError as e:
            assert e.errno == 28, e
        try:
            while True:  # the last partial chunk
                f.write(b"\0" * 512)
        except OSError:
            pass
    return filler


def disk_full(message: str) -> tuple[str, int, int]:
    """(path, bytes needed, bytes free) of the one DiskFull message in `message`."""
    found = DISK_FULL.findall(message)
    assert len(found) == 1, message[-3000:]
    path, needed, free = found[0]
    return path, int(needed.replace(",", "")), int(free.replace(",", ""))


def whole_lines(path: Path) -> list[dict]:
    """The records of a JSON-lines file that must hold whole lines only."""
    text = path.read_text()
    assert text == "" or text.endswith("\n"), f"{path} ends torn: {text[-200:]!r}"
    return [json.loads(line) for line in text.splitlines()]


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


def test_a_disk_that_fills_during_training_is_one_named_error_nothing_torn_and_the_rerun_resumes(tmp_path, small_disk):
    """Before: a TensorBoard thread traceback, then `OSError: [Errno 28] No space left on device` with no
    path or byte counts, and metrics.jsonl torn mid-record."""
    out_dir = small_disk / "run"
    assert _train(tmp_path, out_dir, max_steps=2).returncode == 0  # the checkpoint at step 2: the resume point
    metrics = RunDir(out_dir).metrics
    # no checkpoint due while the disk fills (a checkpoint checks its space first): the logs' writers meet it
    training = subprocess.Popen(_train_command(tmp_path, out_dir, max_steps=100_000, checkpoint_every=100_000),
                                cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: len(metrics.read_text().splitlines()) >= 5, 120), "training did not log steps"
        filler = fill(small_disk)
        _, stderr = training.communicate(timeout=300)
    finally:
        training.kill()
    assert training.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr and "Exception in thread" not in stderr, stderr[-3000:]
    path, needed, free = disk_full(stderr)
    tensorboard = RunDir(out_dir).tensorboard
    assert path == str(metrics) or Path(path).parent == tensorboard, path
    assert needed > free
    whole_lines(metrics)
    for events in tensorboard.glob("events.out.tfevents.*"):  # every record whole: TensorBoard reads each file
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        list(EventFileLoader(str(events)).Load())

    filler.unlink()
    rerun = _train(tmp_path, out_dir, max_steps=4)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "start step 2/4" in rerun.stdout
    assert [r["step"] for r in whole_lines(metrics) if r["kind"] == "train"] == [0, 1, 2, 3]


def test_metrics_and_tensorboard_records_go_down_whole_or_raise_disk_full_naming_their_file(small_disk):
    from gpt2.metrics import MetricsLogger

    run_dir = RunDir(small_disk / "run")
    run_dir.root.mkdir()
    logger = MetricsLogger(run_dir, enabled=True, start_step=0, max_steps=10**6)
    try:  # closed whatever happens: an open file keeps the tmpfs from being unmounted
        filler = fill(small_disk)
        with pytest.raises(OSError) as raised:
            for step in range(10**5):  # the last pages of the files fill first
                logger.log({"step": step, "kind": "train", "loss": 2.5, "lr": 1e-3}, "train")
        path, needed, free = disk_full(f"{raised.value}")
        assert path == str(run_dir.metrics) or Path(path).parent == run_dir.tensorboard, path
        assert needed > free
        logged = whole_lines(run_dir.metrics)
        filler.unlink()
        logger.log({"step": len(logged), "kind": "train", "loss": 2.5}, "train")  # the space back: it goes on
    finally:
        logger.close()
    assert [r["step"] for r in whole_lines(run_dir.metrics)] == list(range(len(logged) + 1))

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir.tensorboard))
    events.Reload()
    assert len(events.Scalars("train/loss")) >= len(logged)  # every record that was written reads back


def test_config_json_the_loss_curve_and_an_hf_export_on_a_full_disk_name_it_and_leave_nothing_half(small_disk):
    import torch

    from common.files import write_json
    from gpt2.config import GPTConfig
    from gpt2.hf import export_hf
    from gpt2.model import GPT
    from tasks.report import plot_loss_curve

    config = small_disk / "run" / "config.json"
    write_json(config, {"lr": 1e-3})
    filler = fill(small_disk)

    with pytest.raises(OSError) as raised:
        write_json(config, {"lr": 1e-3, "padding": "x" * 10_000})
    assert disk_full(str(raised.value))[0] == str(config)
    assert json.loads(config.read_text()) == {"lr": 1e-3}  # the old one, whole

    curve = small_disk / "run" / "loss_curve.png"
    with pytest.raises(OSError) as raised:
        plot_loss_curve([{"step": s, "kind": "train", "loss": 3.0 - s / 10} for s in range(10)], curve, "run")
    assert disk_full(str(raised.value))[0] == str(curve) and not curve.exists()

    export = small_disk / "run" / "hf_step_00000002"
    torch.manual_seed(0)
    with pytest.raises(OSError) as raised:
        export_hf(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=256)), export)
    path, needed, free = disk_full(str(raised.value))
    assert path == str(export) and needed > free
    assert not export.exists() and not list(export.parent.glob(f"{TMP_DIR_PREFIX}*"))
    filler.unlink()


def test_a_hub_download_checks_the_listed_sizes_against_the_free_space_before_the_first_byte(tmp_path, small_disk):
    from tests.fixtures.hub_replica import HubReplica, fineweb_like
    from tests.test_data_hub import repo_files, run_download

    hub = HubReplica()
    hub.old, hub.main = fineweb_like(hub, large_file_bytes=6_000_000)  # the listing: more than the disk holds
    hub.start()
    (small_disk / "filler").write_bytes(b"\0" * (shutil.disk_usage(small_disk).free - (1 << 20)))  # 1 MiB left
    try:
        out = small_disk / "fineweb"
        result = run_download(hub, tmp_path, out, check=False)
    finally:
        hub.stop()
    assert result.returncode == 1, result.stderr[-3000:]
    path, needed, free = disk_full(result.stderr)
    assert path == str(out) and needed == sum(map(len, repo_files(hub, hub.main).values())) > free
    assert "Traceback" not in result.stderr
    assert not list(out.glob("part_*")), list(out.iterdir())  # not one byte of a document file


def _files_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_an_hf_export_counts_its_tokenizer_and_config_in_the_space_it_needs(tmp_path):
    """Before: the pre-check counted the weights alone (`6,492,160 bytes needed` for a directory of 9,499,019
    bytes), so it passed and the tokenizer's write failed the disk."""
    import torch

    from gpt2.config import VOCAB_SIZE, GPTConfig
    from gpt2.hf import export_hf
    from gpt2.model import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=VOCAB_SIZE))  # with the tokenizer
    whole = _files_bytes(export_hf(model, tmp_path / "elsewhere"))
    with tmpfs(tmp_path / "disk", "size=16m") as disk:
        weights = sum(p.nbytes for n, p in model.state_dict().items() if n != "lm_head.weight")
        (disk / "filler").write_bytes(b"\0" * (shutil.disk_usage(disk).free - (weights + whole) // 2))
        assert weights < shutil.disk_usage(disk).free < whole  # room for the weights, not for the directory
        export = disk / "hf_step_00000002"
        with pytest.raises(OSError) as raised:
            export_hf(model, export)
        path, needed, free = disk_full(str(raised.value))
        assert (path, needed) == (str(export), whole) and free < whole
        assert os.listdir(disk) == ["filler"]  # not one byte of it written


def test_a_checkpoint_that_fills_the_disk_mid_write_names_the_checkpoint_and_its_total(tmp_path):
    """A disk with the bytes but not the files (no inode left for the third file): the pre-check passes and
    the write fails. Before: `no space left on .../.tmp_step_00000003_<pid>/model.bin: 93,056 bytes
    needed` (the temporary file and that one file's size, of a checkpoint of 193,699 bytes)."""
    import torch

    from gpt2.config import GPTConfig
    from gpt2.model import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=256))
    state = {"step": 3, "model": model.state_dict(), "rng": torch.get_rng_state()}
    whole = _files_bytes(ckpt.save_checkpoint(tmp_path / "elsewhere", 3, state, model))
    with tmpfs(tmp_path / "disk", "size=8m,nr_inodes=64") as disk:
        out_dir = disk / "run"
        RunDir(out_dir).checkpoints.mkdir(parents=True)
        fillers = []
        with contextlib.suppress(OSError):
            while True:  # every inode taken
                fillers.append(disk / f"f{len(fillers)}")
                fillers[-1].touch()
        for filler in fillers[-4:-1]:  # room for the temporary folder, state.safetensors and state.json only
            filler.unlink()
        with pytest.raises(OSError) as raised:
            ckpt.save_checkpoint(out_dir, 3, state, model)
        path, needed, free = disk_full(str(raised.value))
        assert (path, needed) == (str(RunDir(out_dir).checkpoint(3)), whole)
        assert free > whole  # the bytes were there: the files were not
        assert list(RunDir(out_dir).checkpoints.iterdir()) == []  # nothing half-written


# what a checkpoint's state holds, then every other dtype safetensors writes
STATE_DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
OTHER_DTYPES = ("uint64", "uint32", "uint16", "complex64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                "float8_e5m2fnuz")


@pytest.mark.parametrize("dtypes", [STATE_DTYPES, STATE_DTYPES + OTHER_DTYPES], ids=["state", "all"])
@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt"}], ids=["none", "empty", "format"])
def test_the_safetensors_size_a_pre_check_counts_is_the_size_save_file_writes(tmp_path, dtypes, metadata):
    """Before: tensors of one width were counted in name order, not in safetensors' layout order (its dtypes'
    order), so their offsets' digits and the header's padding came out 8 bytes off; empty metadata was not
    counted, and a uint16/32/64, complex or float8 tensor was a KeyError before the first byte."""
    import torch
    from safetensors.torch import save_file

    from gpt2.checkpoint import safetensors_size

    # names against the layout's order, and sizes whose offsets have 1 to 6 digits
    tensors = {f"t{len(dtypes) - i:02d}": torch.zeros(n, dtype=getattr(torch, dtype))
               for i, (dtype, n) in enumerate(zip(dtypes, itertools.cycle((100003, 1, 1000, 3, 7, 12345))))}
    save_file(tensors, tmp_path / "state.safetensors", metadata=metadata)
    assert safetensors_size(tensors, metadata) == (tmp_path / "state.safetensors").stat().st_size
