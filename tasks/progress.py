"""The one progress reporter of every stage (download, tokenize, train, the scheduled scan): a Prefect progress
artifact kept at the whole percent of the stage's work.

Progress is reported, never relied on: every call to the server goes through `tasks.retry.best_effort`, so
while the API is away an update is dropped (a warning names it) and the next try waits `PAUSE_S`; an outage
of any length costs progress updates, never the stage. The last update (`finish`) is tried whatever the pause.
"""

from __future__ import annotations

import time

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from tasks.retry import best_effort

PAUSE_S = 30.0  # after an update the API did not take, the next try waits this long


class ProgressReporter:
    """A progress artifact `key` (described by `description`), created at once at 0 %; call it with the fraction
    of the work done (0..1): the artifact follows each new whole percent."""

    def __init__(self, key: str, description: str):
        self.key, self.description = key, description
        self.artifact_id = None  # None until the server took the artifact
        self.reached, self.shown = 0, -1  # percent of the work done, percent the server shows
        self.next_try = 0.0  # time.monotonic() before which no update is tried (the API was away)
        self._send()

    def __call__(self, fraction: float) -> None:
        self.reached = max(self.reached, min(int(fraction * 100), 100))
        if self.reached > self.shown and time.monotonic() >= self.next_try:
            self._send()

    def finish(self) -> None:
        """100 %, tried now even during a pause: the work is done and no later update would follow."""
        self.next_try = 0.0
        self(1.0)

    def _send(self) -> None:
        if self.artifact_id is None:  # the first time, or the API was away then
            self.artifact_id = best_effort(f"the progress artifact {self.key}", create_progress_artifact,
                                           float(self.reached), key=self.key, description=self.description)
            sent = self.artifact_id is not None
        else:
            sent = best_effort(f"progress {self.key} ({self.reached} %)", update_progress_artifact, self.artifact_id,
                               float(self.reached)) is not None
        if sent:
            self.shown = self.reached
        else:
            self.next_try = time.monotonic() + PAUSE_S
