"""Cancellation that survives a server outage: the flow run watches its own state while long work runs.

Prefect's worker stops a flow run's process when the run is cancelled, but only while its cancellation
observers live: after a server outage they can give up for good ("Cancellation observer failed. Flow run
cancellation disabled."), and a later cancel leaves the run in Cancelling while training goes on. So the
train stage runs `watch_for_cancellation(stop)` beside the training process: a thread that reads the flow
run's state through the API every few seconds, rides out connection errors (one log line when the API
goes away, one when it is back), and on Cancelling/Cancelled calls `stop` once -- for a local launch,
`tasks.launch.stop_all`, which kills the training process group and refuses to start any later stage's
command. The flow then ends Cancelled (`ends_cancelled` in flows.pipeline), not Failed.

Any launcher stops its job the same way: wrap the wait for the job in `watch_for_cancellation(stop)` with a
`stop` that ends the job (and makes the wait return or raise).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

POLL_S = 5.0  # how often the flow run's state is read: a cancel stops training within seconds
API_TIMEOUT_S = 10.0  # one state read gives up after this long (the next poll tries again)
STOPPING_STATES = frozenset({"CANCELLING", "CANCELLED"})

_cancelled_runs: set[str] = set()  # flow runs this process stopped because they were cancelled


def cancel_requested(flow_run_id: str | None) -> bool:
    """True once a watcher in this process has seen `flow_run_id` cancelled and stopped its work."""
    return flow_run_id in _cancelled_runs


class CancelWatcher:
    """A daemon thread that calls `stop` once when the flow run's state turns Cancelling or Cancelled.

    `read_state` returns the run's state type ("RUNNING", "CANCELLING", ...) or raises when the API cannot
    be reached; `log` takes one line (connection trouble is logged when it starts and when it ends only).
    """

    def __init__(self, flow_run_id: str, stop: Callable[[], None], read_state: Callable[[], str],
                 log: Callable[[str], None], poll_s: float = POLL_S):
        self.flow_run_id, self.stop, self.read_state, self.log, self.poll_s = flow_run_id, stop, read_state, log, poll_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="cancel-watcher")

    def __enter__(self) -> CancelWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        unreachable_since: float | None = None
        while not self._done.wait(self.poll_s):
            try:
                state = self.read_state()
            except Exception as e:  # the server is down or restarting: keep going, keep trying
                if unreachable_since is None:
                    unreachable_since = time.monotonic()
                    self.log(f"cannot reach the Prefect API to check for cancellation ({type(e).__name__}: {e}); "
                             f"work goes on, checking again every {self.poll_s:g} s")
                continue
            if unreachable_since is not None:
                self.log(f"the Prefect API answers again (unreachable for {time.monotonic() - unreachable_since:.0f} s)")
                unreachable_since = None
            if state in STOPPING_STATES:
                self.log(f"flow run is {state.lower()}: stopping its work")
                _cancelled_runs.add(self.flow_run_id)
                self.stop()
                return


def _state_reader(flow_run_id: str) -> Callable[[], str]:
    from prefect.client.orchestration import get_client

    def read_state() -> str:
        with get_client(sync_client=True, httpx_settings={"timeout": API_TIMEOUT_S}) as client:
            return client.read_flow_run(flow_run_id).state_type.value

    return read_state


@contextmanager
def watch_for_cancellation(stop: Callable[[], None]) -> Iterator[CancelWatcher | None]:
    """Within a flow run, call `stop` once if the run is cancelled while the block runs (a no-op outside one)."""
    from prefect import get_run_logger
    from prefect.runtime import flow_run

    flow_run_id = flow_run.get_id()
    if flow_run_id is None:
        yield None
        return
    logger = get_run_logger()
    with CancelWatcher(flow_run_id, stop, _state_reader(flow_run_id), logger.warning) as watcher:
        yield watcher
