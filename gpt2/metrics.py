"""Training metrics: FLOPs per token, GPU peak FLOP/s and MFU, and the logger that writes metrics.jsonl,
TensorBoard scalars and console lines of a run (its paths from gpt2.run_dir)."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import torch

from common.files import atomic_path
from gpt2.config import GPTConfig
from gpt2.run_dir import RunDir

# bf16 dense tensor-core peak per GPU, by name fragment, first match wins (MFU denominator);
# "H200" also matches GH200, and "L40S" comes before "L4"
_PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "B200": 2250e12, "A100": 312e12, "L40S": 362e12,
                    "A10G": 70e12, "L4": 121e12}


def flops_per_token(model_config: GPTConfig, num_params: int, seq_len: int) -> float:
    """Training FLOPs per token, as llm.c estimates it: 6N + 6*L*C*T (docs/reference.md)."""
    return 6 * num_params + 6 * model_config.n_layer * model_config.n_embd * seq_len


def peak_flops(device: torch.device, override: float = 0.0) -> float | None:
    """bf16 dense peak FLOP/s of one GPU (None when unknown, e.g. on the CPU)."""
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in _PEAK_BF16_FLOPS.items() if key in name), None)


class MetricsLogger:
    """metrics.jsonl, TensorBoard scalars and console lines (through a progress bar when interactive).

    Every method is a no-op on ranks other than 0.
    """

    def __init__(self, run_dir: RunDir, enabled: bool, start_step: int, max_steps: int):
        self.enabled = enabled
        self.path = run_dir.metrics
        self.writer = None
        self.progress = None
        self.kept: list[dict[str, Any]] = []  # the records of steps before start_step, from earlier sessions
        if not enabled:
            return
        self.kept = self._truncate(start_step)
        self.file = open(self.path, "a")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir.tensorboard), purge_step=start_step)
        except ImportError:
            print("warning: tensorboard is not installed; no TensorBoard logs", file=sys.stderr, flush=True)
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.progress = tqdm(total=max_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def _truncate(self, start_step: int) -> list[dict[str, Any]]:
        """Drop records of steps >= start_step: a killed run may have logged past its last checkpoint
        (and, killed mid-write, left a partial last line). Returns the records kept."""
        if not self.path.exists():
            return []
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record["step"] < start_step:
                kept.append(record)
        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        return kept

    def print(self, line: str) -> None:
        if not self.enabled:
            return
        if self.progress is not None:
            self.progress.write(line)
        else:
            print(line, flush=True)  # flush: a parent process streaming stdout sees every line live

    def log(self, record: dict[str, Any], tb_prefix: str, line: str | None = None) -> None:
        """Append `record` (NaN/inf written as null) and its numbers as `tb_prefix/key` scalars."""
        if not self.enabled:
            return
        record = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.writer is not None:
            for key, value in record.items():
                if key not in ("step", "kind") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(f"{tb_prefix}/{key}", value, record["step"])
        if line is not None:
            self.print(line)

    def text(self, tag: str, text: str, step: int) -> None:
        self.print(text)
        if self.writer is not None:  # None on ranks other than 0
            self.writer.add_text(tag, text, step)

    def advance(self) -> None:
        if self.progress is not None:
            self.progress.update(1)

    def close(self) -> None:
        if not self.enabled:
            return
        self.file.close()
        if self.writer is not None:
            self.writer.close()
        if self.progress is not None:
            self.progress.close()
