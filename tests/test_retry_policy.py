"""The one retry policy (tasks.retry): real failures, produced by the real code paths, classified once.

Transient: the network, a server that is away, a training process that crashed. Everything else fails at
once: a read-only or permission-denied folder, a name too long for the filesystem, a diverged run, a corrupt
shard. And reporting to the server is best-effort: an unreachable API never fails the work it reports on.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import uuid
from pathlib import Path

import pytest

from tasks.launch import CommandFailed, run_streaming
from tasks.retry import is_transient, refused_a_locked_folder
from tests.fixtures.outage import api_away_warnings
from tests.fixtures.processes import free_port
from tests.fixtures.train.tiny import tiny_config

REPO = Path(__file__).resolve().parent.parent


def _failure_of(fn, *args):
    with pytest.raises(BaseException) as info:
        fn(*args)
    return info.value


def test_a_name_too_long_for_the_filesystem_is_not_transient(tmp_path):
    """Finding 8: a 300-character run_name (OSError [Errno 36]) was tried 3 times."""
    error = _failure_of(os.mkdir, tmp_path / ("r" * 300))
    assert error.errno == errno.ENAMETOOLONG
    assert not is_transient(error)


@pytest.mark.parametrize("number", [errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.ENOENT,
                                    errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.EMFILE])
def test_an_os_error_of_the_local_machine_is_not_transient(number):
    """Finding 8: a read-only artifacts mount (EROFS) was retried 5 times by hellaswag, 3 by train."""
    assert not is_transient(OSError(number, os.strerror(number), "/artifacts/x"))


@pytest.mark.parametrize("number", [errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT, errno.EHOSTUNREACH,
                                    errno.ENETUNREACH])
def test_an_os_error_of_the_network_is_transient(number):
    assert is_transient(OSError(number, os.strerror(number)))


def test_a_connection_refused_by_a_real_socket_is_transient():
    import socket

    error = _failure_of(socket.create_connection, ("127.0.0.1", free_port()))
    assert is_transient(error)


def _train(config_path: Path) -> CommandFailed:
    """gpt2.train on `config_path` as the train stage runs it; the CommandFailed it ends with."""
    lines = []
    return _failure_of(run_streaming, [sys.executable, "-m", "gpt2.train", "--config", str(config_path)], lines.append)


def _write_config(tmp_path: Path, **overrides) -> Path:
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_config(tmp_path, **overrides).to_dict()))
    return path


def test_a_diverged_training_run_is_not_retried(tmp_path):
    """Finding 8: lr=1e308 (TrainingDivergedError) was tried 3 times. (1e308 is now refused by the settings
    check: float32 holds at most 3.4e38; 1e30 still diverges.)"""
    error = _train(_write_config(tmp_path, lr=1e30, max_steps=20, warmup_steps=0, max_bad_steps=2))
    assert isinstance(error, CommandFailed) and "TrainingDivergedError" in str(error)
    assert not is_transient(error)


def test_a_corrupt_shard_is_not_retried(tmp_path):
    """Finding 8: a ShardError was tried 3 times."""
    config = _write_config(tmp_path)
    shard = tmp_path / "shards" / "tiny_train_000001.bin"
    shard.write_bytes(shard.read_bytes()[:5000])  # truncated: the header's token count no longer fits
    error = _train(config)
    assert "ShardError" in str(error)
    assert not is_transient(error)


def test_a_trainer_refused_its_run_directory_is_told_from_its_other_failures(tmp_path):
    """What the train stage waits on and tries again (tasks.train._launch): gpt2.train refused because another
    process holds its run directory; any other failure of it (here a diverged run) is not that."""
    from common.locks import folder_lock

    config = _write_config(tmp_path)
    with folder_lock(tmp_path / "run"):  # another trainer holds the run directory
        refused = _train(config)
    assert "error: FolderLocked: " in str(refused) and refused_a_locked_folder(refused)
    diverged = _train(_write_config(tmp_path, lr=1e30, max_steps=20, warmup_steps=0, max_bad_steps=2))
    assert "TrainingDivergedError" in str(diverged) and not refused_a_locked_folder(diverged)


def test_a_training_process_killed_by_a_signal_is_retried(tmp_path):
    """A crash (OOM killer, a lost node) may pass: a retry resumes from the latest checkpoint."""
    error = _failure_of(run_streaming, [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                        lambda line: None)
    assert isinstance(error, CommandFailed) and error.returncode == -signal.SIGKILL
    assert is_transient(error)


def _child_failure(how: str, nproc: int | None = None) -> CommandFailed:
    """tests.fixtures.failing_child failing `how`, run as the train stage runs its children: alone, or as
    `nproc` ranks of a torchrun (whose report of the failure pushes the ranks' error lines out of the tail)."""
    from tasks.launch import torchrun_command

    args = [how]
    cmd = (torchrun_command("tests.fixtures.failing_child", args, nproc) if nproc
           else [sys.executable, "-m", "tests.fixtures.failing_child", *args])
    error = _failure_of(run_streaming, cmd, lambda line: None, None, REPO)
    assert isinstance(error, CommandFailed), error
    return error


@pytest.mark.parametrize("how, nproc, said", [
    ("overflow", 2, "error: RuntimeError: value cannot be converted to type float without overflow"),
    ("overflow", None, "error: RuntimeError: value cannot be converted to type float without overflow"),
    ("unknown", None, "error: ValueError: a setting no check knew about"),
])
def test_a_child_that_ends_with_an_error_of_its_own_is_not_retried(how, nproc, said):
    """Before: a learning rate beyond float32 made every attempt end with `error: RuntimeError: value
    cannot be converted to type float without overflow`, and the train task was tried 3 times: an error the
    policy did not know by name counted as a crash. The child's own error line is evidence of a failure a
    rerun meets again, wherever torchrun's report pushes it in the output."""
    error = _child_failure(how, nproc)
    assert said in str(error)
    assert not is_transient(error)


@pytest.mark.parametrize("how, said", [
    ("network", "error: ConnectionResetError: [Errno 104]"),
    ("rendezvous-timeout", "error: DistNetworkError: "),
    ("lost-peer", "Connection closed by peer"),
])
def test_a_child_whose_error_names_the_network_or_a_lost_peer_is_retried(how, said):
    error = _child_failure(how)
    assert said in str(error)
    assert is_transient(error)


def test_reporting_to_an_api_that_is_away_never_fails_the_work():
    """Finding 7: the progress artifact update raised ConnectError from the training output callback."""
    from prefect.artifacts import update_progress_artifact

    from tasks.retry import best_effort

    with api_away_warnings() as messages:
        assert best_effort("training progress", update_progress_artifact, uuid.uuid4(), 50.0) is None
    assert any("could not send training progress to the Prefect API" in m for m in messages), messages


def test_a_bug_in_what_is_reported_still_raises():
    from tasks.retry import best_effort

    with pytest.raises(AttributeError):
        best_effort("training progress", lambda: None.missing)


def test_the_progress_reporter_of_every_stage_outlives_an_api_that_is_away():
    """Before: tokenize's progress update raised ConnectError and failed the stage. The one reporter
    (tasks.progress) drops an update the API does not take, pauses, and still tries the last one."""
    from tasks.progress import ProgressReporter

    with api_away_warnings() as messages:
        report = ProgressReporter("tokenize-progress-outage", "documents tokenized")
        for done in range(1, 100):  # every whole percent: all within the pause after the first failure
            report(done / 100)
        report.finish()
    assert len(messages) == 2, messages  # the artifact at the start, the last update: nothing in between
    assert all("could not send" in m and "tokenize-progress-outage" in m for m in messages), messages
