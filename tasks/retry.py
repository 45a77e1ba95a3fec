"""Retry policies: transient failures (network, a crashed training process) retry; deterministic ones don't.

A bad config, a corrupt input, a missing local file or a full disk fails the same way every time, so
retrying only delays the error; those surface at once with their own message.
"""

from __future__ import annotations

import importlib
from typing import Any

from prefect.task_engine import TaskRunTimeoutError
from prefect.tasks import exponential_backoff

from common.files import is_disk_full

# HTTP statuses worth retrying: timeouts, rate limits, server-side errors
TRANSIENT_HTTP_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# OSErrors that describe the local machine, not the network: they will not go away by waiting
_LOCAL_OS_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError)



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
    """True for network trouble (connection errors, timeouts, 408/429/5xx) and `TransientError`."""
    if isinstance(exc, TransientError):
        return True
    status = _http_status(exc)
    if status is not None:
        return status in TRANSIENT_HTTP_STATUS
    if isinstance(exc, _LOCAL_OS_ERRORS) or is_disk_full(exc):  # a full disk does not empty itself
        return False
    return isinstance(exc, (*_NETWORK_ERRORS, OSError))


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
