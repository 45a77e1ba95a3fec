"""Cancel a flow run and wait for it to end, within a time limit: `python -m flows.cancel FLOW_RUN_ID`
(what scripts/run.sh does on Ctrl-C or SIGTERM).

The run is set Cancelling through the server's API, as the UI's Cancel button and `prefect flow-run cancel`
do; the worker then stops the flow-run process, and with it torchrun and the ranks (tasks/launch.py), and
the run ends Cancelled. A run no worker has started yet (Scheduled, Pending) is set Cancelled at once. Every request has a time limit of its own and one that fails for a reason waiting
may mend (common.network: refused, timed out, HTTP 5xx) is repeated, all within `--timeout-s`: the caller
gets its answer in bounded time whatever the server does; any other error (HTTP 404: a run this server does
not hold) ends it at once, named. Prints the final state; exits 0 once the run is final, 1 when it did not
get there in time (run.sh then stops the worker, which takes the flow run's processes with it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from uuid import UUID

from common.network import is_transient_network_error

FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "CRASHED"})
REQUEST_TIMEOUT_S = 5.0


def _request(url: str, body: dict | None, timeout_s: float) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.load(response)


def _cancel_request(state: str) -> dict:
    """A run no worker has started (Scheduled, or Pending: claimed by a worker that may be gone) is set Cancelled at
    once: set Cancelling, it waits for a worker to stop its process, which none may ever do. A process started
    after that finds its run final and does not run it. A running one is set Cancelling, for its worker to stop."""
    if state in ("SCHEDULED", "PENDING"):
        return {"state": {"type": "CANCELLED", "message": "cancelled before a worker started it"}, "force": True}
    return {"state": {"type": "CANCELLING"}}


def cancel(api_url: str, flow_run_id: UUID, timeout_s: float, say=print) -> str | None:
    """Set the run Cancelling (until the server accepts) and wait for a final state, for at most `timeout_s`.
    Returns the final state type, or None when there was none in time (what was last seen is said)."""
    deadline = time.monotonic() + timeout_s
    run_url = f"{api_url.rstrip('/')}/flow_runs/{flow_run_id}"
    asked = False
    last = "no answer from the server"
    while (left := deadline - time.monotonic()) > 0:
        try:
            state = _request(run_url, None, min(REQUEST_TIMEOUT_S, left))["state"]["type"]
            if state in FINAL_STATES:
                return state
            last = f"state {state}"
            if not asked and state != "CANCELLING":
                answer = _request(f"{run_url}/set_state", _cancel_request(state),
                                  min(REQUEST_TIMEOUT_S, max(0.1, deadline - time.monotonic())))
                asked = answer["status"] == "ACCEPT"
                if not asked:
                    last = f"the server answered {answer['status']}: {(answer.get('details') or {}).get('reason')}"
        except (OSError, ValueError, KeyError) as e:  # urllib's errors are OSErrors; a reply not the API's
            if not is_transient_network_error(e):  # e.g. HTTP 404, a run this server does not hold
                say(f"flow run {flow_run_id} could not be cancelled at {api_url}: {e}")
                return None
            last = f"the server did not answer ({e})"
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    say(f"flow run {flow_run_id} did not end within {timeout_s:g} s of the cancel ({last})")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.cancel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("flow_run_id", type=UUID, help="the flow run to cancel (its UUID)")
    parser.add_argument("--timeout-s", type=float, default=90.0, metavar="S",
                        help="give up after this many seconds (default 90)")
    parser.add_argument("--api-url", default=os.environ.get("PREFECT_API_URL"),
                        help="the server's API (default: $PREFECT_API_URL)")
    args = parser.parse_args(argv)
    if not args.api_url:
        parser.error("no server: set PREFECT_API_URL or pass --api-url")
    if not args.timeout_s > 0:
        parser.error(f"--timeout-s must be a positive number of seconds, not {args.timeout_s}")
    say = lambda line: print(f"[run] {line}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        state = cancel(args.api_url, args.flow_run_id, args.timeout_s, say)
    except KeyboardInterrupt:  # a second Ctrl-C: stop waiting (run.sh goes on to stop the worker)
        say(f"not waiting for flow run {args.flow_run_id} to end")
        return 130
    if state is None:
        return 1
    say(f"flow run {args.flow_run_id}: {state}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
