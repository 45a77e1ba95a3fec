"""The flows: `gpt2-pretrain` (every stage), one flow per stage, and `gpt2-evaluate` (scheduled scans).

    download -> tokenize ─┐
    hellaswag ────────────┼-> train -> evaluate, sample
    init ─────────────────┘

A stage flow runs its stage and whatever it needs; the needed stages normally come from cache in
seconds. `force=True` reruns the stage itself even when its cached output is valid.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.config import PipelineConfig
from gpt2.run_dir import RunDir
from tasks.cache import StageRecord
from tasks.download import download_documents
from tasks.evaluate import EvalSettings, evaluate_checkpoint, evaluate_run
from tasks.hellaswag import prepare_hellaswag
from tasks.init import init_model
from tasks.report import run_summary_markdown
from tasks.sample import sample
from tasks.tokenize import tokenize
from tasks.train import train

STAGES = ("download", "tokenize", "hellaswag", "init", "train", "evaluate", "sample")


class _Stages:
    """Runs stages on demand, each at most once per flow run, in dependency order."""

    def __init__(self, config: PipelineConfig, force: str | None = None):
        if force is not None and force not in STAGES:
            raise ValueError(f"force={force!r} is not a stage; stages: {', '.join(STAGES)}")
        self.config = config
        self.force = force
        self.records: dict[str, StageRecord | None] = {}

    def _task(self, name: str, task_obj: Any) -> Any:
        return task_obj.with_options(refresh_cache=True) if name == self.force else task_obj

    def get(self, name: str) -> StageRecord | None:
        if name not in self.records:
            self.records[name] = getattr(self, f"_{name}")()
        return self.records[name]

    def _download(self) -> StageRecord:
        c = self.config
        return self._task("download", download_documents)(c.source, c.source_config, str(c.documents_dir), c.limit)

    def _tokenize(self) -> StageRecord:
        c = self.config
        return self._task("tokenize", tokenize)(self.get("download"), str(c.shards_dir), c.dataset, c.shard_size,
                                                c.limit, c.tokenize_workers)

    def _hellaswag(self) -> StageRecord | None:
        c = self.config
        if c.hellaswag_source is None:
            return None
        return self._task("hellaswag", prepare_hellaswag)(c.hellaswag_source, str(c.hellaswag_dir))

    def _init(self) -> StageRecord:
        c = self.config
        return self._task("init", init_model)(c.model, c.seed, str(c.init_dir), c.init_from)

    def _train(self) -> StageRecord:
        c = self.config
        task_obj = self._task("train", train)
        if c.train_timeout_s:
            task_obj = task_obj.with_options(timeout_seconds=c.train_timeout_s)
        return task_obj(self.get("tokenize"), self.get("hellaswag"), self.get("init"), c.seed, dict(c.train),
                        str(c.runs_dir), c.nproc, c.rendezvous)

    def _evaluate(self) -> StageRecord:
        return self._task("evaluate", evaluate_checkpoint)(self.get("train").checkpoint, self.get("tokenize"),
                                                           self.get("hellaswag"), self.config.eval)

    def _sample(self) -> StageRecord:
        c = self.config
        return self._task("sample", sample)(self.get("train").checkpoint, c.sample_prompt, c.num_samples,
                                            c.sample_tokens, c.seed, c.eval.device)


def run_stage(config: PipelineConfig, stage: str, force: bool = False) -> dict[str, StageRecord | None]:
    """Run `stage` and what it needs; returns the records of every stage that ran, by stage name."""
    stages = _Stages(config, force=stage if force else None)
    stages.get(stage)
    return stages.records


@flow(name="gpt2-pretrain", log_prints=True)
def gpt2_pretrain(config: PipelineConfig = PipelineConfig()) -> dict[str, StageRecord | None]:
    """Every stage: download -> tokenize, HellaSwag, init -> train -> final evaluation and samples."""
    stages = _Stages(config)
    for name in STAGES:
        stages.get(name)
    run, evaluation = stages.records["train"], stages.records["evaluate"]
    hellaswag = evaluation.hellaswag["acc_norm"] if evaluation.hellaswag else None
    figures = {"train_loss": run.train_loss, "val_loss": evaluation.val_loss, "tokens_per_s": run.tokens_per_s,
               "mfu": run.mfu}
    create_markdown_artifact(
        run_summary_markdown(f"gpt2-pretrain: {config.run_name}", run.run_dir, run.steps, run.tokens, figures,
                             hellaswag, run.loss_curve),
        key="gpt2-pretrain-summary", description="the run beside the reference points",
    )
    return stages.records


def _stage_flow(stage: str, name: str | None = None):
    def stage_flow(config: PipelineConfig = PipelineConfig(), force: bool = False) -> dict[str, StageRecord | None]:
        return run_stage(config, stage, force)

    stage_flow.__doc__ = f"The {stage} stage alone (what it needs comes from cache); force=True reruns it."
    stage_flow.__name__ = f"{stage}_flow"
    return flow(name=name or f"gpt2-{stage}", log_prints=True)(stage_flow)


download_flow = _stage_flow("download")
tokenize_flow = _stage_flow("tokenize")
hellaswag_flow = _stage_flow("hellaswag")
init_flow = _stage_flow("init")
train_flow = _stage_flow("train")
evaluate_final_flow = _stage_flow("evaluate", name="gpt2-evaluate-final")  # gpt2-evaluate: the scheduled scan
sample_flow = _stage_flow("sample")


# ---------------------------------------------------------------------------------------------------------
# scheduled evaluation


@flow(name="gpt2-evaluate", log_prints=True)
def gpt2_evaluate(runs_dir: str = "artifacts/runs", settings: EvalSettings = EvalSettings()) -> list[dict[str, Any]]:
    """Evaluate every complete checkpoint under `runs_dir` that has not been evaluated yet.

    A checkpoint counts as evaluated once its run's evaluations/ folder holds a result for its exact
    content; results go to the run's TensorBoard log (at the checkpoint's step) and a table artifact.
    """
    rows = [row for run_dir in RunDir.all_under(runs_dir) for row in evaluate_run(run_dir, settings)]
    create_table_artifact(rows, key="gpt2-evaluations", description=f"checkpoints under {runs_dir}")
    return rows
