"""The one retry policy: every failure is classified here, once; transient ones retry, the rest fail at once.

Transient: the network (connection errors, timeouts, HTTP 408/425/429/5xx), a Prefect server that is away, a
training process that crashed (killed, out of memory, a node lost: a retry resumes from its checkpoint).
Everything else fails the same way every time, so retrying only delays the error: a bad setting, a corrupt
input or shard, a diverged run, a full or read-only disk, a name too long for the filesystem, a missing
file. Those surface at once with their own message.

`is_transient` decides for an exception raised in this process. A failed child process (`CommandFailed`, a
Slurm job) is judged on evidence, by `child_failure_is_transient`: a child of ours that ended with its own
error line (`error: Type: message`, common.cli) failed of that error, which a rerun meets again, unless the
type is one this policy names as transient (the network, a lost peer, a rendezvous timeout); a child that
died without saying (a signal: the OOM killer, a lost node, NCCL's watchdog) crashed, and is retried. Work
that only reports to the server (progress, summaries) goes through `best_effort`, so an outage of any length
never fails it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar

from prefect.task_engine import TaskRunTimeoutError
from prefect.tasks import exponential_backoff

from common.cli import error_line_type
from common.locks import FolderLocked
from common.network import NETWORK_ERRNOS, is_transient_network_error
from tasks.launch import CommandFailed

# the errors a child's own error line may name that may pass on a rerun, by type name: the network (Python's and
# the HTTP clients'), a peer or the rendezvous store lost or timed out (torch.distributed's DistError family)
TRANSIENT_CHILD_ERRORS = frozenset({
    "TransientError", "ConnectionError", "ConnectionResetError", "ConnectionAbortedError", "ConnectionRefusedError",
    "BrokenPipeError", "TimeoutError", "ConnectError", "ReadTimeout", "WriteTimeout", "ConnectTimeout",
    "PoolTimeout", "RemoteProtocolError", "ReadError", "WriteError", "DistNetworkError", "DistStoreError",
    "DistBackendError",
})  # fmt: skip
# what torch's gloo transport raises, as a plain RuntimeError, when another rank's machine or process goes away
LOST_PEER_MESSAGES = ("Connection closed by peer", "Connection reset by peer")
# errors a child may name in a traceback (no error line of ours: `--debug`, a crash outside run_cli) that a
# rerun would meet again, by class name, qualified or not (`gpt2.guard.TrainingDivergedError: ...`)
DETERMINISTIC_CHILD_ERRORS = ("DiskFull", "CheckpointError", "ConfigError", "TrainingDivergedError", "ShardError",
                              "EvalFileError")
_ERRNO_IN_OUTPUT = re.compile(r"\w+Error: \[Errno (\d+)\]")  # an exception line: `OSError: [Errno 30] ...`
_CHILD_ERROR_LINE = re.compile(rf"\b(?:{'|'.join(DETERMINISTIC_CHILD_ERRORS)}): ")


class TransientError(RuntimeError):
    """A failure that may pass on its own (e.g. a training process killed by a node failure)."""


def is_transient(exc: BaseException) -> bool:
    """True for network trouble (connection errors, timeouts, 408/429/5xx), `TransientError` and a child process
    that crashed; False for everything else."""
    if isinstance(exc, TransientError):
        return True
    if isinstance(exc, CommandFailed):
        return child_failure_is_transient(str(exc))
    return is_transient_network_error(exc)


def child_failure_is_transient(output: str) -> bool:
    """Whether a child process that failed with this output (its own error lines and its last lines, as
    `tasks.launch.ChildOutput.said` gives them) may pass on a rerun.

    Its error lines (one per rank that failed) are the evidence: transient only if every one names a transient
    error (`_error_line_is_transient`). Without one, the child died before it could say (a signal, a crash):
    transient, unless a traceback in the output names an error a rerun meets again.
    """
    said = _error_lines(output)
    if said:
        return all(_error_line_is_transient(line) for line in said)
    if _CHILD_ERROR_LINE.search(output):
        return False
    return all(int(number) in NETWORK_ERRNOS for number in _ERRNO_IN_OUTPUT.findall(output))


def refused_a_locked_folder(exc: BaseException) -> bool:
    """Whether a failed child (CommandFailed, a Slurm job's failure: their messages quote its error lines) ended
    because another process holds the folder it writes: every error line it said is FolderLocked
    (common.locks). Not a failure of the work: whoever holds the lock is doing it, and the caller waits."""
    said = _error_lines(str(exc))
    return bool(said) and all(error_line_type(line) == FolderLocked.__name__ for line in said)


def _error_lines(output: str) -> list[str]:
    """The lines of a child's output that are its own error lines (`error: Type: message`, common.cli)."""
    return [line for line in output.splitlines() if error_line_type(line) is not None]


def _error_line_is_transient(line: str) -> bool:
    """An error line naming the network or a lost peer: a type this policy names as transient, gloo's lost
    connection, or an OSError with a network errno (`error: OSError: [Errno 111] Connection refused`)."""
    if error_line_type(line) in TRANSIENT_CHILD_ERRORS or any(m in line for m in LOST_PEER_MESSAGES):
        return True
    errnos = _ERRNO_IN_OUTPUT.findall(line)
    return bool(errnos) and all(int(number) in NETWORK_ERRNOS for number in errnos)


def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect `retry_condition_fn`: retry a failed run only if its exception is transient.

    The task's own time limit (Prefect's TaskRunTimeoutError, a TimeoutError) is not: a retry would only run
    out of it again.
    """
    try:
        state.result()
    except TaskRunTimeoutError:
        return False
    except Exception as exc:
        return is_transient(exc)
    return False


# Task options of stages that talk to the network: 10 s, 20 s, 40 s, 80 s (each ±50 %), then give up.
NETWORK_RETRIES: dict[str, Any] = dict(
    retries=4,
    retry_delay_seconds=exponential_backoff(backoff_factor=10),
    retry_jitter_factor=0.5,
    retry_condition_fn=retry_if_transient,
)


T = TypeVar("T")


def best_effort(what: str, send: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """`send(*args, **kwargs)` when the server can be reached; on a transient failure (the API is away) log a
    warning naming `what` and return None, so reporting never fails the work it reports on. Other errors
    (a bug, a refused request) still raise."""
    try:
        return send(*args, **kwargs)
    except Exception as e:
        if not is_transient(e):
            raise
        _logger().warning("could not send %s to the Prefect API (%s: %s); the work goes on", what, type(e).__name__, e)
        return None


def _logger() -> logging.Logger | logging.LoggerAdapter:
    """The run's logger inside a flow or task run (the worker's log has it as well), else this module's."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)
