"""Follow a flow run on the terminal: `python -m flows.watch FLOW_RUN_ID` (what scripts/run.sh shows).

One line per state change of the flow run and of each stage, a training progress line every
`--progress-every` seconds (step, loss, tokens/s, ETA, from gpt2.train's step lines in the run's logs); a
failed stage or run is shown with its state message (the error), and a run that did not complete ends with
its id and the command that prints its logs. Exits 0 when the run completed, 1 otherwise.

`prefect deployment run --watch` prints every event and log record instead, cut to the terminal's width.
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
from prefect.client.schemas.sorting import LogSort

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


def say(line: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {line}", flush=True)


def stage_name(task_run_name: str) -> str:
    """`tokenize-3f2` -> `tokenize`: the short suffix Prefect appends to a default task run name goes
    (a name a task gives its runs, `evaluate-step-20`, stays)."""
    return re.sub(r"^([^-]+)-[0-9a-f]{3}$", r"\1", task_run_name)


class Watcher:
    def __init__(self, client: SyncPrefectClient, flow_run_id: UUID, progress_every_s: float):
        self.client = client
        self.flow_run_id = flow_run_id
        self.progress_every_s = progress_every_s
        self.states: dict[UUID, str] = {}  # the last state name shown, by run id (the flow run's and its stages')
        self.logs_seen = 0
        self.progress: Progress | None = None
        self.progress_shown_at = 0.0

    def poll(self) -> bool:
        """Show what changed; True once the flow run is in a final state."""
        flow_run = self.client.read_flow_run(self.flow_run_id)  # first: what follows is at least as new
        task_runs = self.client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
        for task_run in sorted(task_runs, key=lambda r: r.created or datetime.min):
            self._show_state(task_run.id, stage_name(task_run.name), task_run.state)
        self._read_logs()
        self._show_state(flow_run.id, f"flow run {flow_run.name}", flow_run.state)
        return flow_run.state is not None and flow_run.state.is_final()

    def _show_state(self, run_id: UUID, what: str, state) -> None:
        if state is None or self.states.get(run_id) == state.name:
            return
        self.states[run_id] = state.name
        detail = f": {state.message}" if state.is_failed() or state.is_crashed() else ""
        say(f"{what}: {state.name}{detail}")

    def _read_logs(self) -> None:
        while logs := self.client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[self.flow_run_id])),
                                            offset=self.logs_seen, limit=200, sort=LogSort.TIMESTAMP_ASC):
            self.logs_seen += len(logs)
            for log in logs:
                self.progress = Progress.parse(log.message) or self.progress
        self.show_progress()

    def show_progress(self, final: bool = False) -> None:
        now = time.monotonic()
        if self.progress is not None and (final or now - self.progress_shown_at >= self.progress_every_s):
            say(self.progress.line())
            self.progress_shown_at = now
            self.progress = None


def watch(flow_run_id: UUID, poll_s: float = 1.0, progress_every_s: float = 10.0) -> int:
    with get_client(sync_client=True) as client:
        watcher = Watcher(client, flow_run_id, progress_every_s)
        while not watcher.poll():
            time.sleep(poll_s)
        watcher.show_progress(final=True)  # the last step's line, however recently one was shown
        flow_run = client.read_flow_run(flow_run_id)
    if flow_run.state.is_completed():
        return 0
    print(f"  flow run id: {flow_run_id}\n  its logs:    prefect flow-run logs {flow_run_id}", flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.watch", description=__doc__.split("\n\n")[0])
    parser.add_argument("flow_run_id", type=UUID, help="the flow run to follow (its UUID)")
    parser.add_argument("--progress-every", type=float, default=10.0, metavar="S",
                        help="seconds between training progress lines (default 10)")
    args = parser.parse_args(argv)
    try:
        return watch(args.flow_run_id, progress_every_s=args.progress_every)
    except KeyboardInterrupt:  # Ctrl-C stops the watching only; run.sh cancels the run itself
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
