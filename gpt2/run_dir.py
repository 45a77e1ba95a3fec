"""The run directory: the one place that knows where a training run keeps each of its files.

    <root>/
      launch_config.json the TrainConfig a launcher hands to gpt2.train (the pipeline's train stage)
      config.json        the TrainConfig + what was resolved at start (gpt2.train)
      metrics.jsonl      one JSON record per train step, val loss, HellaSwag (gpt2.metrics)
      tensorboard/       the same as TensorBoard scalars, plus the evaluations' points
      checkpoints/       step_XXXXXXXX/ (gpt2.checkpoint)
      evaluations/       step_XXXXXXXX.json: one evaluation per checkpoint (the pipeline's ledger)
      samples/           step_XXXXXXXX.json: text samples of a checkpoint (gpt2.sample --out)
      summary.json       the run's outcome, rewritten at the end of every training session
      loss_curve.png     train and val loss against step (the pipeline's report)
      hf_step_XXXXXXXX/  a checkpoint exported as a Hugging Face directory (the pipeline's export stage)
      LOCK               held by the training process that writes here (`RunDir.lock`)
      slurm/             job.sh, job-<id>.out (the job's output) and heartbeat, when a Slurm job trains it

Everything that reads or writes a run asks a `RunDir` for the path instead of spelling the layout out.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_STEP_NAME = re.compile(r"step_(\d{8})")  # what _step_name writes


def _step_name(step: int) -> str:
    return f"step_{step:08d}"


class RunDirLocked(RuntimeError):
    """Another process is writing this run directory; the message names it (pid, host)."""


@dataclass(frozen=True)
class RunDir:
    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))  # accept a str; frozen dataclass

    @classmethod
    def of_checkpoint(cls, checkpoint_dir: str | os.PathLike) -> "RunDir":
        """The run a checkpoint directory (<root>/checkpoints/step_XXXXXXXX) belongs to."""
        return cls(Path(checkpoint_dir).parent.parent)

    @classmethod
    def all_under(cls, root: str | os.PathLike) -> list["RunDir"]:
        """Every run directory (one with a checkpoints/ folder) at any depth under `root`, sorted."""
        return [cls(p.parent) for p in sorted(Path(root).rglob("checkpoints")) if p.is_dir()]

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def launch_config(self) -> Path:
        """The TrainConfig a launcher (the pipeline's train stage) hands to gpt2.train as `--config`."""
        return self.root / "launch_config.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def evaluations(self) -> Path:
        return self.root / "evaluations"

    @property
    def samples(self) -> Path:
        return self.root / "samples"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def loss_curve(self) -> Path:
        return self.root / "loss_curve.png"

    @property
    def lock_file(self) -> Path:
        return self.root / "LOCK"

    @property
    def slurm(self) -> Path:
        """The Slurm launcher's folder (tasks.slurm): the job script, each job's output and the heartbeat."""
        return self.root / "slurm"

    @property
    def slurm_script(self) -> Path:
        return self.slurm / "job.sh"

    @property
    def slurm_heartbeat(self) -> Path:
        """Touched by the task while it waits for the job; the job cancels itself when it goes stale."""
        return self.slurm / "heartbeat"

    def slurm_output(self, job_id: str) -> Path:
        return self.slurm / f"job-{job_id}.out"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / _step_name(step)

    def evaluation(self, step: int) -> Path:
        return self.evaluations / f"{_step_name(step)}.json"

    def sample(self, step: int) -> Path:
        return self.samples / f"{_step_name(step)}.json"

    def hf_export(self, step: int) -> Path:
        """Where the pipeline's export stage writes checkpoint `step` as a Hugging Face directory."""
        return self.root / f"hf_{_step_name(step)}"

    def checkpoint_dirs(self) -> list[tuple[int, Path]]:
        """(step, path) of every directory named like a checkpoint, finished or not, oldest first."""
        if not self.checkpoints.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.checkpoints.iterdir() if (m := _STEP_NAME.fullmatch(p.name))]
        return sorted(found)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the run's writer lock for the block; raise RunDirLocked naming the holder if another process
        holds it.

        An flock on LOCK: the kernel releases it when its holder dies however it dies, so a lock left by a
        killed process is taken over by the next writer; the file's text only names the holder.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    raise
                raise RunDirLocked(
                    f"{self.root} is being written by {self._holder(fd)} (lock {self.lock_file}); wait for that "
                    "run to end or stop it, or use another run directory"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _holder(self, fd: int) -> str:
        try:
            holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except json.JSONDecodeError:
            holder = {}
        return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
