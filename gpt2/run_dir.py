"""The run directory: the one place that knows where a training run keeps each of its files.

    <root>/
      launch_config.json the TrainConfig a launcher hands to gpt2.train (the pipeline's train stage)
      config.json        the TrainConfig + what was resolved at start (gpt2.train)
      data_identity.json the val shards' and HellaSwag file's sha256 the run trains and is validated on (the
                         pipeline's train stage); the scheduled scan scores checkpoints only on that data
      metrics.jsonl      one JSON record per train step, val loss, HellaSwag (gpt2.metrics)
      tensorboard/       the same as TensorBoard scalars, plus the evaluations' points
      checkpoints/       step_XXXXXXXX/ (gpt2.checkpoint)
      evaluations/       step_XXXXXXXX.json: one evaluation per checkpoint (the pipeline's ledger)
      samples/           step_XXXXXXXX.json: text samples of a checkpoint (gpt2.sample --out)
      summary.json       the run's outcome, rewritten at the end of every training session
      loss_curve.png     train and val loss against step (the pipeline's report)
      hf_step_XXXXXXXX/  a checkpoint exported as a Hugging Face directory (the pipeline's export stage)
      LOCK               held by the training process that writes here (`RunDir.lock`)
      slurm/             job-<id>.sh and job-<id>.out (each job's script and output) and heartbeat, when Slurm
                         jobs train it

Everything that reads or writes a run asks a `RunDir` for the path instead of spelling the layout out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ContextManager

from common.locks import LOCK_FILE, FolderLocked, folder_lock
from common.paths import inside

_STEP_NAME = re.compile(r"step_(\d{8})")  # what _step_name writes


def _step_name(step: int) -> str:
    return f"step_{step:08d}"


RunDirLocked = FolderLocked  # another process is writing this run directory; the message names it (pid, host)


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
    def data_identity(self) -> Path:
        """The content identity of the data the run trains and is validated on (the pipeline's train stage)."""
        return self.root / "data_identity.json"

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
        return self.root / LOCK_FILE

    @property
    def slurm(self) -> Path:
        """The Slurm launcher's folder (tasks.slurm): the job script, each job's output and the heartbeat."""
        return self.root / "slurm"

    def slurm_script(self, job_id: str) -> Path:
        """The script of Slurm job `job_id` (each submission keeps its own: a later one never overwrites it)."""
        return self.slurm / f"job-{job_id}.sh"

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

    def check_confined(self) -> None:
        """PathOutsideRoot unless every path of the layout resolves inside the run directory: a symbolic link
        planted as checkpoints/, metrics.jsonl, ... would send a writer's files somewhere else."""
        for path in (self.config, self.launch_config, self.data_identity, self.metrics, self.tensorboard,
                     self.checkpoints, self.evaluations, self.samples, self.summary, self.loss_curve, self.slurm):
            inside(path, self.root)

    def lock(self, wait: bool = False, on_wait: Callable[[str], None] | None = None) -> ContextManager[Path]:
        """Hold the run's writer lock for the block (common.locks.folder_lock); another holder: RunDirLocked naming
        it, or with `wait` the block runs once it is free. Every writer of the run takes it, so the layout is
        checked here (`check_confined`), and temporary folders of an interrupted checkpoint write are removed
        once the lock is held."""
        self.check_confined()
        return folder_lock(self.root, wait, on_wait, leftovers_in=[self.checkpoints])
