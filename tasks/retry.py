"""Retry policies: transient failures (network, a crashed training process) retry; deterministic ones don't.

A bad config, a corrupt input, a missing local file or a full disk fails the same way every time, so
retrying only delays the error; those surface at once with their own message.
"""

from __future__ import annotations

from typing import Any

from prefect.task_engine import TaskRunTimeoutError
from prefect.tasks import exponential_backoff

from common.network import is_transient_network_error


class TransientError(RuntimeError):
    """A failure that may pass on its own (e.g. a training process killed by a node failure)."""


def is_transient(exc: BaseException) -> bool:
    """True for network trouble (connection errors, timeouts, 408/429/5xx) and `TransientError`."""
    return isinstance(exc, TransientError) or is_transient_network_error(exc)


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
