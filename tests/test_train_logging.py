"""Logging: FLOPs accounting, console lines, metrics.jsonl records and TensorBoard scalars."""

import json
import re

import pytest

from gpt2.config import GPTConfig
from gpt2.metrics import MetricsLogger, flops_per_token
from gpt2.run_dir import RunDir
from gpt2.train import train
from tests.fixtures.train.tiny import single_thread  # noqa: F401 (autouse fixture)
from tests.fixtures.train.tiny import read_metrics, tiny_config

D12_PARAMS = 124_475_904  # llm.c's count, padded wte included (docs/reference.md)


def test_flops_per_token_of_d12_is_designs_8e8():
    # 6N + 6*L*C*T = 6 * 124,475,904 + 6 * 12 * 768 * 1024
    assert flops_per_token(GPTConfig.from_descriptor("d12"), D12_PARAMS, 1024) == 746_855_424 + 56_623_104


def test_one_line_per_step_and_a_record_per_step(tmp_path, capsys):
    config = tiny_config(tmp_path, max_steps=4, val_every=2, val_steps=1, log_every=1)
    train(config)
    out = capsys.readouterr().out
    step_lines = [line for line in out.splitlines() if re.match(r"^step\s+(\d+)/(\d+) \|", line)]  # as llm.c
    assert [int(re.match(r"^step\s+(\d+)/4", line).group(1)) for line in step_lines] == [0, 1, 2, 3]
    assert all(key in step_lines[0] for key in ("loss", "lr", "norm", "ms", "tok/s"))

    records = read_metrics(config.out_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    for r in records:
        assert set(r) >= {"loss", "lr", "norm", "ms", "tok_s", "mfu", "skipped"}
        assert r["tok_s"] == pytest.approx(config.total_batch_size / (r["ms"] / 1e3), rel=1e-6)
        assert r["mfu"] is None  # no GPU peak to compare against on a CPU
    assert [r["step"] for r in read_metrics(config.out_dir, "val")] == [0, 2, 4]


def test_records_are_flushed_as_written_and_tensorboard_gets_scalars(tmp_path):
    logger = MetricsLogger(RunDir(tmp_path), enabled=True, start_step=0, max_steps=10)
    logger.log({"step": 0, "kind": "train", "loss": 2.5, "norm": float("nan"), "skipped": False}, "train")
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()  # readable before close
    assert json.loads(lines[0]) == {"step": 0, "kind": "train", "loss": 2.5, "norm": None, "skipped": False}
    logger.log({"step": 5, "kind": "val", "val_loss": 2.25}, "val")
    logger.close()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(0, 2.5)]
    assert [(e.step, e.value) for e in events.Scalars("val/val_loss")] == [(5, 2.25)]
    assert "train/skipped" not in events.Tags()["scalars"]  # booleans are not plotted


def test_other_ranks_write_nothing(tmp_path):
    logger = MetricsLogger(RunDir(tmp_path), enabled=False, start_step=0, max_steps=10)
    logger.log({"step": 0, "kind": "train", "loss": 2.5}, "train", "a line")
    logger.close()
    assert list(tmp_path.iterdir()) == []


def test_one_step_convention_across_console_metrics_tensorboard_png_and_checkpoints(tmp_path, capsys):
    """Step s means the weights after s optimizer updates, everywhere (docs/training.md, "Steps")."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tasks.report import loss_curve_figure

    config = tiny_config(tmp_path, max_steps=4, val_every=2, val_steps=1, log_every=1, checkpoint_every=2)
    train(config)
    console = {int(m.group(1)): float(m.group(2))
               for m in re.finditer(r"^step\s+(\d+)/4 \| loss (\S+)", capsys.readouterr().out, flags=re.M)}
    metrics = read_metrics(config.out_dir)
    jsonl = {r["step"]: r["loss"] for r in metrics}
    events = EventAccumulator(str(RunDir(config.out_dir).tensorboard))
    events.Reload()
    tensorboard = {e.step: e.value for e in events.Scalars("train/loss")}
    train_line = loss_curve_figure(metrics + read_metrics(config.out_dir, "val"), "run").axes[0].lines[0]
    png = dict(zip(train_line.get_xdata(), train_line.get_ydata()))

    assert list(jsonl) == [0, 1, 2, 3]  # the first loss is the initial weights' (no update yet)
    assert list(console) == list(tensorboard) == list(png) == list(jsonl)
    for step, loss in jsonl.items():
        assert console[step] == pytest.approx(loss, abs=1e-6)  # printed with 6 decimals
        assert tensorboard[step] == pytest.approx(loss, rel=1e-6) and png[step] == loss
    # weights after s updates: the val loss, the checkpoint of the same step and its evaluation record
    val_steps = [r["step"] for r in read_metrics(config.out_dir, "val")]
    checkpoints = sorted(p.name for p in (RunDir(config.out_dir).root / "checkpoints").glob("step_*"))
    assert val_steps == [0, 2, 4] and checkpoints == ["step_00000000", "step_00000002", "step_00000004"][-len(checkpoints):]
    assert {int(name[5:]) for name in checkpoints} <= set(val_steps)
