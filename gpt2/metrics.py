"""Training metrics: FLOPs per token, GPU peak FLOP/s and MFU, and the logger that writes metrics.jsonl,
TensorBoard scalars and console lines of a run (its paths from gpt2.run_dir).

Every write goes through common.files: a record is appended whole or not at all, and a full disk is one
DiskFull naming the file, the bytes and the free space.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.files import AppendOnlyFile, JsonLinesFile, atomic_path, json_text, naming_disk_full, read_log_records
from gpt2.config import GPTConfig
from gpt2.run_dir import RunDir

if TYPE_CHECKING:
    import torch

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
    import torch  # here, not above: the pipeline's flow process reads metrics without paying torch's import

    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in _PEAK_BF16_FLOPS.items() if key in name), None)


def warn(message: str) -> None:
    """How gpt2 names a line it skipped: a `warning:` line on stderr (the pipeline logs it with the others)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def read_metrics(path: str | os.PathLike, skip_bad: Callable[[str], None] = warn) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl, oldest first ([] if none): each a JSON object with an integer
    `step`. Any other line (torn by a crash, edited) is skipped and named once through `skip_bad`
    (common.files.read_log_records): a reader of the log never stops training or its report."""
    records = []
    for record in read_log_records(path, skip_bad):
        if is_metrics_record(record):
            records.append(record)
        else:
            skip_bad(f"{path}: a record without an integer step ({json.dumps(record)[:80]}); skipped")
    return records


def is_metrics_record(record: object) -> bool:
    """What every reader of metrics.jsonl may rely on: a JSON object with an integer `step`."""
    return isinstance(record, dict) and type(record.get("step")) is int


_event_files = itertools.count()  # makes each event file name of this process unique


class EventLog:
    """A TensorBoard event file, written by the caller's thread one whole record per call (through
    common.files.AppendOnlyFile): a full disk is one DiskFull naming the file, never a writer thread's traceback
    or a torn record. `purge_step`: TensorBoard drops the events of earlier files at and after it (a resumed
    run's steps past its checkpoint), as torch's SummaryWriter(purge_step=...) does."""

    def __init__(self, logdir: str | os.PathLike, purge_step: int | None = None):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.record_writer import RecordWriter

        logdir = Path(logdir)
        with naming_disk_full(logdir, 0):
            logdir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_event_files)}"
        self.file = AppendOnlyFile(logdir / name)
        self.records = RecordWriter(self.file)
        self._write(Event(file_version="brain.Event:2"))
        if purge_step is not None:
            self._write(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    # The summaries torch's SummaryWriter writes, made from TensorBoard's own protos (no torch: the pipeline's
    # evaluation files its numbers from the flow process)
    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._write(Event(step=step, summary=Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])))

    def add_text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

        plugin = SummaryMetadata.PluginData(plugin_name="text", content=TextPluginData(version=0).SerializeToString())
        tensor = TensorProto(dtype="DT_STRING", string_val=[text.encode()],
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        value = Summary.Value(tag=f"{tag}/text_summary", metadata=SummaryMetadata(plugin_data=plugin), tensor=tensor)
        self._write(Event(step=step, summary=Summary(value=[value])))

    def _write(self, event: Any) -> None:
        event.wall_time = time.time()
        self.records.write(event.SerializeToString())

    def close(self) -> None:
        self.file.close()


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
        self.file = JsonLinesFile(self.path, warn)
        try:
            self.writer = EventLog(run_dir.tensorboard, purge_step=start_step)
        except ImportError:
            print("warning: tensorboard is not installed; no TensorBoard logs", file=sys.stderr, flush=True)
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.progress = tqdm(total=max_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def _truncate(self, start_step: int) -> list[dict[str, Any]]:
        """Drop records of steps >= start_step: a killed run may have logged past its last checkpoint
        (and, killed mid-write, left a partial last line; a bad line is named and dropped). Returns the
        records kept."""
        if not self.path.exists():
            return []
        kept = [record for record in read_metrics(self.path) if record["step"] < start_step]
        text = "".join(json_text(r, self.path) + "\n" for r in kept)
        with atomic_path(self.path, size=len(text.encode())) as tmp:
            tmp.write_text(text)
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
        self.file.append_record(record)
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
