"""Retry policies: transient failures (network, a crashed training process) retry; deterministic ones don't.

A bad config, a corrupt input or a missing local file fails the same way every time, so retrying only
delays the error; those surface at once with their own message.
"""

from __future__ import annotations

from typing import Any

from prefect.tasks import exponential_backoff

# HTTP statuses worth retrying: timeouts, rate limits, server-side errors
TRANSIENT_HTTP_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# OSErrors that describe the local machine, not the network: they will not go away by waiting
_LOCAL_OS_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError)


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
    if isinstance(exc, _LOCAL_OS_ERRORS):
        return False
    return isinstance(exc, (ConnectionError, TimeoutError, OSError))


def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect `retry_condition_fn`: retry a failed run only if its exception is transient."""
    try:
        state.result()
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
