"""The one retry policy: every failure is classified here, once; transient ones retry, the rest fail at once.

Transient: the network (connection errors, timeouts, HTTP 408/425/429/5xx), a Prefect server that is away, a
training process that crashed (killed, out of memory, a node lost: a retry resumes from its checkpoint).
Everything else fails the same way every time, so retrying only delays the error: a bad setting, a corrupt
input or shard, a diverged run, a full or read-only disk, a name too long for the filesystem, a missing
file. Those surface at once with their own message.

`is_transient` decides for an exception raised in this process; a failed child process (`CommandFailed`) is
judged by the error its last output lines name. Work that only reports to the server (progress, summaries)
goes through `best_effort`, so an outage of any length never fails it.
"""

from __future__ import annotations

import errno
import importlib
import logging
import re
import socket
from collections.abc import Callable
from typing import Any, TypeVar

from prefect.task_engine import TaskRunTimeoutError
from prefect.tasks import exponential_backoff

from common.files import is_disk_full
from tasks.launch import CommandFailed

# HTTP statuses worth retrying: timeouts, rate limits, server-side errors
TRANSIENT_HTTP_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# errnos of the network: an OSError with any other errno (read-only filesystem, name too long, permission
# denied, no such file, ...) describes the local machine and will not go away by waiting
NETWORK_ERRNOS = frozenset({
    errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH,
    errno.EHOSTDOWN, errno.ENETUNREACH, errno.ENETDOWN, errno.ENETRESET, errno.EPIPE, errno.EAGAIN,
    errno.EADDRNOTAVAIL, errno.ENOTCONN, errno.EPROTO,
})  # fmt: skip
# errors a child process (gpt2.train, ...) may end with that a rerun would meet again, by class name: the
# child's traceback names them, qualified (`gpt2.guard.TrainingDivergedError: ...`)
DETERMINISTIC_CHILD_ERRORS = ("DiskFull", "CheckpointError", "ConfigError", "TrainingDivergedError", "ShardError",
                              "EvalFileError")
# OSErrors that describe the local machine whatever their errno (also when raised without one)
_LOCAL_OS_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError)
_ERRNO_IN_OUTPUT = re.compile(r"\w+Error: \[Errno (\d+)\]")  # an exception line: `OSError: [Errno 30] ...`
_CHILD_ERROR_LINE = re.compile(rf"\b(?:{'|'.join(DETERMINISTIC_CHILD_ERRORS)}): ")


def _http_client_network_errors() -> tuple[type[BaseException], ...]:
    """Network failures of the HTTP clients that are not OSErrors: httpx's (Prefect's client) and httpx2's
    (huggingface_hub's, so the hub lookups and `datasets` streaming). Protocol misuse is not among them."""
    found = []
    for module in ("httpx", "httpx2"):
        try:
            lib = importlib.import_module(module)
        except ImportError:
            continue
        found += [getattr(lib, name) for name in ("NetworkError", "TimeoutException", "RemoteProtocolError")]
    return tuple(found)


_NETWORK_ERRORS = (ConnectionError, TimeoutError, *_http_client_network_errors())


class TransientError(RuntimeError):
    """A failure that may pass on its own (e.g. a training process killed by a node failure)."""


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status of urllib, requests/huggingface_hub and httpx errors, if the exception carries one."""
    for owner in (exc, getattr(exc, "response", None)):
        for attr in ("code", "status_code", "status"):
            value = getattr(owner, attr, None)
            if isinstance(value, int) and 100 <= value < 600:
                return value
    return None


def is_transient(exc: BaseException) -> bool:
    """True for network trouble (connection errors, timeouts, 408/429/5xx), `TransientError` and a child process
    that crashed; False for everything else."""
    if isinstance(exc, TransientError):
        return True
    if isinstance(exc, CommandFailed):
        return child_failure_is_transient(str(exc))
    status = _http_status(exc)
    if status is not None:
        return status in TRANSIENT_HTTP_STATUS
    if isinstance(exc, _LOCAL_OS_ERRORS) or is_disk_full(exc):  # a full disk does not empty itself
        return False
    if isinstance(exc, OSError) and exc.errno is not None and not isinstance(exc, socket.gaierror):
        return exc.errno in NETWORK_ERRNOS
    # no errno: the HTTP clients' own errors (requests' are OSErrors without one), a name lookup that failed
    return isinstance(exc, (*_NETWORK_ERRORS, OSError))


def child_failure_is_transient(output: str) -> bool:
    """Whether a child process that failed with this output (its last lines) may pass on a rerun: a crash (a
    signal, an out-of-memory kill, a lost peer) may; an error that the same inputs raise again does not."""
    if _CHILD_ERROR_LINE.search(output):
        return False
    return all(int(number) in NETWORK_ERRNOS for number in _ERRNO_IN_OUTPUT.findall(output))


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
