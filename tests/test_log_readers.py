"""Readers of our own logs never kill work: each reader of metrics.jsonl skips a line it cannot parse and names
the file and line once; writers append whole lines, and a torn tail (a crash mid-write) is cut before the next
record, never continued by it (common.files owns both). Before, the line below, inserted as the 4th
line of metrics.jsonl, failed the train stage on every rerun."""

from __future__ import annotations

import json
import re

import pytest

from common.files import JsonLinesFile, JsonLinesTail, iter_jsonl_records, read_log_records
from gpt2.metrics import MetricsLogger, read_metrics
from gpt2.run_dir import RunDir

BAD_LINE = '{"step": 2, "kind": "tra'
TORN_TAIL = '{"step": 6, "kind": "train", "lo'


def _record(step: int) -> str:
    return json.dumps({"step": step, "kind": "train", "loss": 3.0 - step / 10}) + "\n"


@pytest.fixture
def damaged(tmp_path):
    """metrics.jsonl with steps 0..5, the bad line 4th, and a torn tail (no newline)."""
    path = tmp_path / "metrics.jsonl"
    lines = [_record(s) for s in range(6)]
    path.write_text("".join(lines[:3] + [BAD_LINE + "\n"] + lines[3:]) + TORN_TAIL)
    return path


def _named(messages: list[str], where: str) -> int:
    return sum(bool(re.search(rf"{re.escape(where)}\b", m)) for m in messages)


def test_read_metrics_skips_a_bad_line_and_a_torn_tail_naming_each_once(damaged):
    messages: list[str] = []
    assert [r["step"] for r in read_metrics(damaged, messages.append)] == [0, 1, 2, 3, 4, 5]
    assert _named(messages, f"{damaged} line 4") == 1 and _named(messages, f"{damaged} line 8") == 1, messages
    assert len(messages) == 2


def test_a_log_line_that_is_json_but_no_record_is_skipped_and_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(_record(0) + "[1, 2]\n" + '{"kind": "train"}\n' + _record(1))
    messages: list[str] = []
    assert [r["step"] for r in read_metrics(path, messages.append)] == [0, 1]
    assert _named(messages, f"{path} line 2") == 1 and len(messages) == 2, messages


def test_the_follower_of_a_live_log_skips_a_bad_line_once_and_waits_for_a_line_being_written(damaged):
    """What the train stage's progress reads (tasks.train._TrainingProgress), as training appends."""
    messages: list[str] = []
    tail = JsonLinesTail(damaged, messages.append)
    assert [r["step"] for r in tail.new_records()] == [0, 1, 2, 3, 4, 5]  # the torn tail may still be written
    assert tail.new_records() == []
    with open(damaged, "a") as f:
        f.write('ss": 2.4}\n' + _record(7))
    assert [r["step"] for r in tail.new_records()] == [6, 7]
    assert messages == [f"{damaged} line 4: not valid JSON (Unterminated string starting at: line 1 column 21 "
                        "(char 20)); line skipped"]


def test_a_resumed_training_session_drops_the_bad_lines_and_appends_whole_ones(damaged, capsys):
    logger = MetricsLogger(RunDir(damaged.parent), enabled=True, start_step=4, max_steps=10)
    logger.log({"step": 4, "kind": "train", "loss": 2.6}, "train")
    logger.close()
    assert [json.loads(line)["step"] for line in damaged.read_text().splitlines()] == [0, 1, 2, 3, 4]
    err = capsys.readouterr().err
    assert err.count(f"{damaged} line 4") == 1 and err.count(f"{damaged} line 8") == 1, err


def test_a_torn_tail_is_cut_before_the_next_record_is_appended(damaged):
    messages: list[str] = []
    log = JsonLinesFile(damaged, messages.append)
    log.append_record({"step": 7, "kind": "train"})
    log.close()
    assert damaged.read_text().endswith(_record(5) + '{"step": 7, "kind": "train"}\n')
    assert len(messages) == 1 and f"{damaged}: its last line was torn" in messages[0], messages


def test_an_input_file_line_that_is_not_json_is_still_an_error(damaged):
    """Documents and HellaSwag examples are inputs, not our logs: a bad line there stops with its name."""
    with pytest.raises(ValueError, match=f"{re.escape(str(damaged))} line 4: not valid JSON"):
        list(iter_jsonl_records(damaged))
    assert len(read_log_records(damaged, lambda message: None)) == 6


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_no_json_writer_writes_a_number_json_cannot_hold(tmp_path, value):
    """NaN and Infinity are not JSON: before, write_json wrote `"acc": NaN` into evaluations/step_*.json. Every JSON
    writer goes through common.files.json_text, which refuses them naming the file and the key; nothing is written."""
    from common.files import NotJsonNumber, write_json

    target = tmp_path / "step_20.json"
    record = {"step": 20, "hellaswag": {"n": 0, "acc": value}}
    with pytest.raises(NotJsonNumber, match=rf"^{target}: hellaswag\.acc is {value}, which JSON cannot hold"):
        write_json(target, record)
    assert list(tmp_path.iterdir()) == []

    log = tmp_path / "metrics.jsonl"
    file = JsonLinesFile(log)
    file.append_record({"step": 1, "loss": 3.0})
    with pytest.raises(NotJsonNumber, match=rf"^{log}: losses\[1\] is {value}, which JSON cannot hold"):
        file.append_record({"step": 2, "losses": [3.0, value]})
    file.close()
    assert log.read_text() == '{"step": 1, "loss": 3.0}\n'


def test_a_json_file_of_ours_with_bytes_that_are_not_utf8_is_named_with_the_byte(tmp_path):
    """Before: `ValueError: 'utf-8' codec can't decode byte 0xff in position 9: invalid start byte; delete it and
    rerun the stage`: what to delete was not named."""
    from common.files import read_json

    manifest = tmp_path / "manifest.json"
    manifest.write_bytes(b'{"name": "\xff"}\n')
    with pytest.raises(ValueError) as raised:
        read_json(manifest)
    assert str(raised.value) == (f"{manifest}: not UTF-8 text: byte 0xff at byte offset 10 of the file (invalid "
                                 "start byte); delete it and rerun the stage")
