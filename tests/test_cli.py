"""The `python -m` entry points of data/ and gpt2/ as users type them: a mistake ends with one line naming it
(`error: Type: message`), no traceback; `--debug` shows the traceback (common/cli.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _bad_shard(tmp_path: Path) -> str:
    (tmp_path / "bad_train_000000.bin").write_bytes(bytes(2048))  # no llm.c header
    return str(tmp_path / "bad_train_*.bin")


# (module, arguments that fail, what the error line names); {tmp} is the test's folder
CASES = {
    "data.shards": (["--source", "work/mydocs", "--out", "{tmp}/shards"], "SourceNotFound: work/mydocs"),
    "data.fineweb": (["--source", "work/mydocs", "--out", "{tmp}/docs"], "SourceNotFound: work/mydocs"),
    "data.hellaswag": (["--source", "{tmp}/missing.jsonl", "--out", "{tmp}/eval"], "{tmp}/missing.jsonl"),
    "gpt2.sample": (["--checkpoint", "{tmp}/missing", "--prompt", "Hello"], "{tmp}/missing: not a checkpoint"),
    "gpt2.evaluate": (["--checkpoint", "{tmp}/missing", "--hellaswag", "{tmp}/h.bin", "--device", "cpu"],
                      "{tmp}/missing: not a checkpoint"),
    "gpt2.train": (["--train-data", "{shard}", "--val-every", "0", "--sample-every", "0", "--device", "cpu",
                    "--out-dir", "{tmp}/run", "--model", "d6", "--batch-size", "1", "--seq-len", "64",
                    "--total-batch-size", "64"], "ShardError: {tmp}/bad_train_000000.bin: header"),
}


def _run(module: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("module", CASES)
def test_an_error_is_one_line_naming_it_and_debug_shows_the_traceback(module, tmp_path):
    args, named = CASES[module]
    fill = {"tmp": str(tmp_path), "shard": _bad_shard(tmp_path)}
    args = [arg.format(**fill) for arg in args]
    result = _run(module, args)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and named.format(**fill) in result.stderr, result.stderr[-3000:]

    debug = _run(module, [*args, "--debug"])
    assert debug.returncode == 1 and "Traceback" in debug.stderr, debug.stderr[-3000:]


def test_every_entry_point_of_data_and_gpt2_goes_through_the_wrapper():
    """A new `python -m` module gets the same ending: its `__main__` block calls common.cli.run_cli."""
    for path in sorted([*REPO.glob("data/*.py"), *REPO.glob("gpt2/*.py")]):
        text = path.read_text()
        if 'if __name__ == "__main__":' in text:
            block = text.split('if __name__ == "__main__":', 1)[1]
            assert "run_cli(main)" in block, f"{path.relative_to(REPO)}: __main__ does not call run_cli(main)"
