"""Follow a flow run on the terminal: `python -m flows.watch FLOW_RUN_ID` (what scripts/run.sh shows).

One line per state change of the flow run and of each stage, a training progress line every
`--progress-every` seconds (step, loss, tokens/s, ETA, from gpt2.train's step lines in the run's logs), in
the order they happened (a few seconds behind, so that late logs fall into place); a failed stage or run is
shown with its state message (the error; a flow run's that is a stage's error shown above names that stage
instead of repeating it), a stage waiting for a retry (`AwaitingRetry`, `Retrying`) with
its reason (e.g. an output folder locked by another run), and a run that did not complete ends with its id.

The server may go away while the run goes on (killed and restarted, overloaded): the watcher says so in one
line, keeps asking, and says so in one line when the server answers again; what happened meanwhile is shown
then, in order. A run that completed ends with what it made (`output:` lines of its log: the run folder, final
val loss and HellaSwag accuracy, or a stage's output folder). Calls to the server are its own: Prefect's client
retries nothing, so an outage is reported at the first failed call. Exits 0 when the run completed, 1 when it
ended otherwise, 2 when the watcher stopped without seeing the run end (an error of its own; the run may go on),
3 when no worker started the run within `--start-within` seconds of its start time, 130 on Ctrl-C.

`prefect deployment run --watch` prints Prefect's events instead, and no training progress.
"""

from __future__ import annotations

import argparse
import fcntl
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TypeVar
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
from prefect.client.schemas.objects import State
from prefect.client.schemas.sorting import LogSort
from prefect.settings import PREFECT_API_REQUEST_TIMEOUT, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from common.network import is_transient_network_error

# gpt2.train's console line of a training step (gpt2/train.py, _step_line)
STEP_LINE = re.compile(r"step\s+(?P<step>\d+)/(?P<max_steps>\d+) \| loss (?P<loss>\S+) .*?\| (?P<ms>[\d.]+) ms \| "
                       r"(?P<tok_s>[\d,]+) tok/s")


@dataclass
class Progress:
    step: int
    max_steps: int
    loss: float
    ms: float
    tok_s: float

    @classmethod
    def parse(cls, message: str) -> Progress | None:
        found = STEP_LINE.search(message)
        if found is None:
            return None
        return cls(int(found["step"]), int(found["max_steps"]), float(found["loss"]), float(found["ms"]),
                   float(found["tok_s"].replace(",", "")))

    def line(self) -> str:
        # step s is the loss of the weights after s updates; the updates still to do are max_steps - s - 1
        eta_s = round(max(0, self.max_steps - self.step - 1) * self.ms / 1e3)
        eta = f"{eta_s // 3600}:{eta_s // 60 % 60:02d}:{eta_s % 60:02d}"
        return (f"train: step {self.step}/{self.max_steps} | loss {self.loss:.4f} | {self.tok_s:,.0f} tok/s | "
                f"ETA {eta}")


# What a finished run made, one log line each, `output: LABEL: VALUE` (flows.pipeline._log_outputs writes them)
OUTPUT_PREFIX = "output: "
OUTPUT_LINE = re.compile(rf"^{re.escape(OUTPUT_PREFIX)}(?P<label>[^:]+): (?P<value>.*)$")
RETRY_REASON = re.compile(r"^Task run failed with \w+: (?P<reason>.*)$", re.S)  # Prefect's log line of a retry
# Prefect's message of a run that raised: this, then the exception (`Type: message`, prefect.states.format_exception)
RAISED = re.compile(r"^(?:Task|Flow) run encountered an exception:? (?P<type>\w+): ", re.S)
HOLD_BACK_S = 5.0  # logs reach the server in batches (every 2 s): events this recent may still have company


def say(at: datetime, line: str) -> None:
    print(f"[{at.astimezone():%H:%M:%S}] {line}", flush=True)


def stage_name(task_run_name: str) -> str:
    """`tokenize-3f2` -> `tokenize`: the short suffix Prefect appends to a default task run name goes
    (a name a task gives its runs, `evaluate-step-20`, stays)."""
    return re.sub(r"^([^-]+)-[0-9a-f]{3}$", r"\1", task_run_name)


@dataclass
class Event:
    """Something to show, at the time it happened: a state change (`state` set) or a training step line
    (`progress`)."""
    at: datetime
    run_id: UUID | None
    what: str = ""
    state: State | None = None
    progress: Progress | None = None


class Watcher:
    """Collects state changes and log lines from the API and shows them in the order they happened.

    States and logs arrive by different paths (logs in batches, a few seconds late), so an event is shown
    only once it is `hold_back_s` old, merged by time with the others; once the flow run is final, states
    and logs are read until they stop coming and everything left is shown.
    """

    def __init__(self, client: SyncPrefectClient, flow_run_id: UUID, progress_every_s: float,
                 hold_back_s: float = HOLD_BACK_S):
        self.client = client
        self.flow_run_id = flow_run_id
        self.progress_every_s = progress_every_s
        self.hold_back = timedelta(seconds=hold_back_s)
        self.states_seen: set[UUID] = set()  # state ids, of the flow run's and its stages' states
        self.pending: list[Event] = []
        # the reasons Prefect logged for a task run's retries, oldest first, until its retry states show them
        # (the log line comes just after the AwaitingRetry state, so they are matched by run, not by time)
        self.retry_reasons: dict[UUID, list[str]] = defaultdict(list)
        self.logs_seen = 0
        self.progress: Event | None = None  # the latest step line not shown yet
        self.progress_shown_at = 0.0
        self.flow_run = None  # as last read
        self.outputs: dict[str, str] = {}  # what the run made, by label, from its `output:` log lines
        self.stage_errors: dict[str, str] = {}  # the stage whose failure showed each error (its exception, as text)

    def poll(self) -> bool:
        """Show what is old enough to be in order; True once the flow run is in a final state."""
        flow_run = self.client.read_flow_run(self.flow_run_id)  # first: what follows is at least as new
        self.flow_run = flow_run
        self._collect(flow_run)
        self._show(until=datetime.now(timezone.utc) - self.hold_back)
        return flow_run.state is not None and flow_run.state.is_final()

    def finish(self, poll_s: float) -> None:
        """After the final state: what is still on its way (stage states and logs reach the server after the
        flow run's state), until a hold-back passes with nothing new; then every event left and the last step."""
        quiet_since = time.monotonic()
        deadline = quiet_since + 6 * self.hold_back.total_seconds()
        while time.monotonic() - quiet_since < self.hold_back.total_seconds() and time.monotonic() < deadline:
            time.sleep(poll_s)
            if self._collect(self.client.read_flow_run(self.flow_run_id)):
                quiet_since = time.monotonic()
        self._show(until=None)
        self.show_progress(final=True)

    def _collect(self, flow_run) -> int:
        """Queue the flow run's and its stages' new states and the new logs' events; returns how many came."""
        before = len(self.pending) + self.logs_seen
        self._note_states(flow_run.id, f"flow run {flow_run.name}", flow_run.state, self.client.read_flow_run_states)
        task_runs = self.client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
        for task_run in task_runs:
            self._note_states(task_run.id, stage_name(task_run.name), task_run.state, self.client.read_task_run_states)
        self._read_logs()
        return len(self.pending) + self.logs_seen - before

    def _note_states(self, run_id: UUID, what: str, current: State | None,
                     read_history: Callable[[UUID], list[State]]) -> None:
        """Queue the states of a run not seen yet, from its history: a retry passes through AwaitingRetry and
        Retrying between two polls. Scheduled and Pending, which every run passes through, are left out."""
        if current is None or current.id in self.states_seen:
            return
        for state in read_history(run_id):
            if state.id not in self.states_seen:
                self.states_seen.add(state.id)
                if not (state.is_scheduled() or state.is_pending()) or state.name == "AwaitingRetry":
                    self.pending.append(Event(state.timestamp, run_id, what, state=state))

    def _read_logs(self) -> None:
        """Queue the step lines and retry reasons among the new logs."""
        while logs := self.client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[self.flow_run_id])),
                                            offset=self.logs_seen, limit=200, sort=LogSort.TIMESTAMP_ASC):
            self.logs_seen += len(logs)
            for log in logs:
                if progress := Progress.parse(log.message):
                    self.pending.append(Event(log.timestamp, None, progress=progress))
                elif output := OUTPUT_LINE.match(log.message):
                    self.outputs[output["label"]] = output["value"]
                elif log.task_run_id and (retry := RETRY_REASON.match(log.message)):
                    self.retry_reasons[log.task_run_id].append(retry["reason"])

    def _show(self, until: datetime | None) -> None:
        """Show the pending events up to `until` (all of them: None), oldest first."""
        self.pending.sort(key=lambda e: e.at)  # stable: events of one time keep the order they were read in
        due = [e for e in self.pending if until is None or e.at <= until]
        self.pending = self.pending[len(due):]
        for event in due:
            if event.progress is not None:
                self.progress = event
                self.show_progress()
            else:
                self.show_progress(final=True)  # the steps before a state change come before it
                say(event.at, f"{event.what}: {event.state.name}{self._detail(event)}")

    def _detail(self, event: Event) -> str:
        """Why: a failed or crashed state's message (the error), a retry's reason (state message, else the
        error Prefect logged when it scheduled the retry: a stage waiting for a lock says so here)."""
        state = event.state
        if state.is_failed() or state.is_crashed():
            return self._failure(event)
        if state.name in ("AwaitingRetry", "Retrying"):  # Retrying alone when the retry has no delay
            reasons = self.retry_reasons[event.run_id]
            reason = state.message or (reasons.pop(0) if reasons else None)
            return f": {reason}" if reason else ""
        return ""

    def _failure(self, event: Event) -> str:
        """A failure's message; a flow run's that is a stage's error shown above (flows.pipeline fails of its first
        failed stage's own exception) names that stage instead: the error, and the child output it quotes (tens of
        lines of torchrun's traceback), come once."""
        message = event.state.message or ""
        raised = RAISED.match(message)
        if raised is None:
            return f": {message}"
        error = message[raised.start("type"):]
        if event.run_id != self.flow_run_id:
            self.stage_errors.setdefault(error, event.what)
        elif stage := self.stage_errors.get(error):
            return f": {raised['type']} in {stage}, shown above"
        return f": {message}"

    def show_outputs(self) -> None:
        """What the run made (its folder, val loss, HellaSwag accuracy...), one aligned line each."""
        for label, value in self.outputs.items():
            print(f"  {label + ':':<13} {value}", flush=True)

    def show_progress(self, final: bool = False) -> None:
        now = time.monotonic()
        if self.progress is not None and (final or now - self.progress_shown_at >= self.progress_every_s):
            say(self.progress.at, self.progress.progress.line())
            self.progress_shown_at = now
            self.progress = None


T = TypeVar("T")
# exit statuses; 2: the end of the run not seen; 3: no worker started it in time (it is still Scheduled or Pending)
COMPLETED, ENDED_OTHERWISE, STOPPED_WATCHING, NOT_STARTED = 0, 1, 2, 3
START_WITHIN_S = 120.0  # a worker asks for runs every 2 s (run.sh's) to 10 s and starts one in seconds


class ServerLink:
    """Calls to the server that outlive its outages: a call that fails for the network (refused, reset, timed
    out, 5xx) is tried again every `retry_s` for as long as it takes; the first such failure prints one line,
    and the first answer after it one more."""

    def __init__(self, url: str, retry_s: float):
        self.url, self.retry_s = url, retry_s
        self.lost_at: float | None = None  # time.monotonic() of the first failure of this outage

    def call(self, request: Callable[[], T]) -> T:
        while True:
            try:
                result = request()
            except Exception as e:
                if not is_transient_network_error(e):
                    raise
                self._lost(e)
                time.sleep(self.retry_s)
                continue
            if self.lost_at is not None:
                away_s = time.monotonic() - self.lost_at
                say(datetime.now(timezone.utc), f"the Prefect server answers again (away {away_s:.0f} s)")
                self.lost_at = None
            return result

    def _lost(self, error: Exception) -> None:
        if self.lost_at is None:
            self.lost_at = time.monotonic()
            say(datetime.now(timezone.utc), f"lost the Prefect server at {self.url} ({type(error).__name__}); "
                "the run goes on without it: waiting for it to answer again")


# The watcher's own client: no retries of Prefect's (five, with backoff: about a minute before a call fails, so a
# 45 s outage showed nothing and a longer one was reported a minute late, its time away short by that minute) and a
# short time limit per call (a server that accepts and does not answer); ServerLink does the retrying, saying so.
OWN_CLIENT = {PREFECT_CLIENT_MAX_RETRIES: 0, PREFECT_API_REQUEST_TIMEOUT: 10.0}


class StartWait:
    """The wait for a worker to start the run: `started` once it left Scheduled and Pending (its process runs it, or
    it ended), then the lock `release_fd` holds (run.sh's .prefect/run.lock, inherited) is released so that
    scripts/stop.sh, waiting on it, cannot stop the worker between the submission and the start; `overdue` when it
    is still waiting `within_s` after its scheduled start."""

    def __init__(self, within_s: float, release_fd: int | None):
        self.within_s, self.release_fd = within_s, release_fd
        self.started = False

    def check(self, flow_run) -> None:
        state = flow_run.state
        if not self.started and state is not None and not (state.is_scheduled() or state.is_pending()):
            self.started = True
            if self.release_fd is not None:
                fcntl.flock(self.release_fd, fcntl.LOCK_UN)

    def overdue(self, flow_run) -> bool:
        start = flow_run.expected_start_time or flow_run.created
        return not self.started and (datetime.now(timezone.utc) - start).total_seconds() > self.within_s


def watch(flow_run_id: UUID, poll_s: float = 1.0, progress_every_s: float = 10.0,
          start_within_s: float = START_WITHIN_S, release_fd: int | None = None) -> int:
    with temporary_settings(updates=OWN_CLIENT), get_client(sync_client=True) as client:
        link = ServerLink(str(client.api_url), retry_s=max(poll_s, 2.0))
        watcher = Watcher(client, flow_run_id, progress_every_s)
        start = StartWait(start_within_s, release_fd)
        while not link.call(watcher.poll):
            start.check(watcher.flow_run)
            if start.overdue(watcher.flow_run):
                print(f"error: NotStarted: no worker started flow run {flow_run_id} within {start_within_s:g} s of its "
                      f"start time (it is {watcher.flow_run.state.name}); is a worker of its pool running? Stop and "
                      "start again: bash scripts/stop.sh, then bash scripts/run.sh", flush=True)
                return NOT_STARTED
            time.sleep(poll_s)
        start.check(watcher.flow_run)
        link.call(lambda: watcher.finish(poll_s))
        flow_run = link.call(lambda: client.read_flow_run(flow_run_id))
    if flow_run.state.is_completed():
        watcher.show_outputs()
        return COMPLETED
    print(f"  flow run id: {flow_run_id}", flush=True)
    return ENDED_OTHERWISE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.watch", description=__doc__.split("\n\n")[0])
    parser.add_argument("flow_run_id", type=UUID, help="the flow run to follow (its UUID)")
    parser.add_argument("--progress-every", type=float, default=10.0, metavar="S",
                        help="seconds between training progress lines (default 10)")
    parser.add_argument("--start-within", type=float, default=START_WITHIN_S, metavar="S",
                        help=f"give up (exit 3) when no worker started the run S seconds after its start time "
                             f"(default {START_WITHIN_S:g})")
    parser.add_argument("--release-fd", type=int, metavar="FD",
                        help="a file descriptor whose flock to release once a worker started the run (run.sh's "
                             ".prefect/run.lock)")
    args = parser.parse_args(argv)
    try:
        return watch(args.flow_run_id, progress_every_s=args.progress_every, start_within_s=args.start_within,
                     release_fd=args.release_fd)
    except KeyboardInterrupt:  # Ctrl-C stops the watching only; run.sh cancels the run itself
        return 130
    except Exception as e:  # never a traceback, never a word on how the run ended: the watcher did not see it
        print(f"[watch] stopped following flow run {args.flow_run_id}: {type(e).__name__}: {e}; the run may go on: "
              f"prefect flow-run inspect {args.flow_run_id}", flush=True)
        return STOPPED_WATCHING


if __name__ == "__main__":
    raise SystemExit(main())
