"""Outlier guard: keeps non-finite and (optionally) outlier updates away from the weights.

Each step reports its loss and global grad norm before the optimizer step. The guard keeps a rolling
window of accepted values and computes a z-score against it (as llm.c's OutlierDetector: only once the
window is full). The step is skipped when the loss or norm is NaN/inf, or when a z-score exceeds its
threshold (0 disables that check). Too many skips in a row raise `TrainingDivergedError`.

In DDP every rank sees the same (all-reduced) loss and norm, so every rank takes the same decision.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


class TrainingDivergedError(RuntimeError):
    """Raised after `max_bad_steps` consecutive skipped steps."""


class RollingZScore:
    """z-score of a value against the last `window` accepted values (NaN until the window is full)."""

    def __init__(self, window: int = 128):
        self.window = window
        self.values: deque[float] = deque(maxlen=window)

    def zscore(self, x: float) -> float:
        if len(self.values) < self.window:
            return math.nan
        n = len(self.values)
        mean = sum(self.values) / n
        var = sum((v - mean) ** 2 for v in self.values) / n
        return (x - mean) / math.sqrt(var) if var > 0 else 0.0

    def add(self, x: float) -> None:
        self.values.append(x)


@dataclass
class GuardDecision:
    skip: bool
    reason: str  # "" when the step goes through
    loss_z: float
    norm_z: float


class OutlierGuard:
    def __init__(self, window: int = 128, loss_z: float = 0.0, norm_z: float = 0.0, max_bad_steps: int = 10):
        self.loss_stats = RollingZScore(window)
        self.norm_stats = RollingZScore(window)
        self.loss_threshold = loss_z
        self.norm_threshold = norm_z
        self.max_bad_steps = max_bad_steps
        self.bad_in_a_row = 0

    def check(self, loss: float, norm: float) -> GuardDecision:
        """Decide whether this step's update may be applied; raises after too many skips in a row."""
        loss_z, norm_z = self.loss_stats.zscore(loss), self.norm_stats.zscore(norm)
        if not (math.isfinite(loss) and math.isfinite(norm)):
            reason = f"non-finite loss {loss} or grad norm {norm}"
        elif self.loss_threshold and loss_z > self.loss_threshold:
            reason = f"loss z-score {loss_z:.2f} > {self.loss_threshold}"
        elif self.norm_threshold and norm_z > self.norm_threshold:
            reason = f"grad norm z-score {norm_z:.2f} > {self.norm_threshold}"
        else:
            reason = ""
        if reason:
            self.bad_in_a_row += 1
            if self.bad_in_a_row >= self.max_bad_steps:
                raise TrainingDivergedError(
                    f"{self.bad_in_a_row} steps in a row skipped (last: {reason}); the run diverged. "
                    "Resume from an earlier checkpoint with a lower --lr, or raise --max-bad-steps"
                )
        else:
            self.bad_in_a_row = 0
            self.loss_stats.add(loss)  # only accepted steps shape the statistics
            self.norm_stats.add(norm)
        return GuardDecision(skip=bool(reason), reason=reason, loss_z=loss_z, norm_z=norm_z)

    def state_dict(self) -> dict:
        return {"loss": list(self.loss_stats.values), "norm": list(self.norm_stats.values),
                "bad_in_a_row": self.bad_in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.loss_stats.values.clear()
        self.loss_stats.values.extend(state["loss"])
        self.norm_stats.values.clear()
        self.norm_stats.values.extend(state["norm"])
        self.bad_in_a_row = state["bad_in_a_row"]
