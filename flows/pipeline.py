"""The flows: `gpt2-pretrain` (every stage), one flow per stage, and `gpt2-evaluate` (scheduled scans).

    download -> tokenize ─┐
    hellaswag ────────────┼-> train -> evaluate, sample, export (Hugging Face directory)
    init ─────────────────┘

Stages that do not depend on each other run at the same time (task futures). A stage flow runs its stage
and whatever it needs; the needed stages normally come from cache in seconds. `force=True` reruns the
stage itself even when its cached output is valid. Every flow validates all its settings first
(flows.config.check_settings), and kills the processes it started when it ends abnormally
(tasks.launch.stop_children_on_exit).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run
from prefect.states import Cancelled

from flows.config import PipelineSettings, check_settings, merge_with_deployment, settings_parameters
from flows.names import PIPELINE_FLOW, SCAN_FLOW, STAGE_FLOWS
from flows.watch import OUTPUT_PREFIX
from tasks.cache import StageRecord
from tasks.cancel_watch import cancel_requested
from tasks.download import download_documents
from tasks.export import export_hf
from tasks.evaluate import EvalRecord, EvalSettings, evaluate_checkpoint, scan_runs
from tasks.hellaswag import prepare_hellaswag
from tasks.init import init_model
from tasks.launch import stop_children_on_exit
from tasks.report import run_summary_markdown
from tasks.retry import best_effort
from tasks.sample import sample
from tasks.tokenize import tokenize
from tasks.train import TrainRecord, train

STAGES = ("download", "tokenize", "hellaswag", "init", "train", "evaluate", "sample", "export")
INPUTS = {  # the stages each stage takes the output of: the DAG above
    "download": (), "tokenize": ("download",), "hellaswag": (), "init": (),
    "train": ("tokenize", "hellaswag", "init"), "evaluate": ("train", "tokenize", "hellaswag"), "sample": ("train",),
    "export": ("train",),
}
Future = PrefectFuture | None  # None: a stage that is switched off (no HellaSwag source)


def resolved_settings(parameters: dict[str, Any]) -> PipelineSettings:
    """The flow run's settings, validated; a deployment run's nested values merged into the deployment's."""
    context = FlowRunContext.get()
    run = context.flow_run if context else None
    if run is not None and run.deployment_id is not None:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            deployment = client.read_deployment(run.deployment_id).parameters
        merged = merge_with_deployment(run.parameters, deployment)
        # only the settings: a stage flow's run also carries `force`, which is not one
        parameters = {name: merged.get(name, value) for name, value in parameters.items()}
    settings = check_settings(parameters)
    get_run_logger().info("settings: %s", settings.model_dump_json(exclude_none=True))
    return settings


class Stages:
    """Submits each stage's task with its settings wired in; returns futures, so independent stages overlap."""

    def __init__(self, settings: PipelineSettings, force: str | None = None):
        if force is not None and force not in STAGES:
            raise ValueError(f"force={force!r} is not a stage; stages: {', '.join(STAGES)}")
        self.s = settings
        self.force = force
        self.submitted: list[PrefectFuture] = []  # in submission order: every stage after what it needs

    def _submit(self, name: str, task_obj: Any, *args: Any) -> PrefectFuture:
        if name == self.force:
            task_obj = task_obj.with_options(refresh_cache=True)
        future = task_obj.submit(*args)
        self.submitted.append(future)
        return future

    @contextmanager
    def root_cause(self) -> Iterator[None]:
        """Fail with the first failed stage's own error, not with a later stage's "upstream did not finish".

        A stage whose input failed never runs, and asking it for its result raises `UnfinishedRun`; the flow
        run's state message (the UI, `prefect flow-run inspect`) should instead say what went wrong where.
        """
        try:
            yield
        except Exception:
            for future in self.submitted:
                future.wait()
                if future.state.is_failed() or future.state.is_crashed():
                    future.result()  # raises the stage's own exception
            raise

    def download(self) -> PrefectFuture:
        s = self.s
        return self._submit("download", download_documents, s.source, s.source_config, str(s.documents_dir), s.limit,
                            s.source_revision)

    def tokenize(self, documents: PrefectFuture) -> PrefectFuture:
        s = self.s
        return self._submit("tokenize", tokenize, documents, str(s.shards_dir), s.dataset, s.shard_size, s.limit,
                            s.tokenize_workers)

    def hellaswag(self) -> Future:
        s = self.s
        if s.hellaswag_source is None:
            return None
        return self._submit("hellaswag", prepare_hellaswag, s.hellaswag_source, str(s.hellaswag_dir))

    def init(self) -> PrefectFuture:
        s = self.s
        return self._submit("init", init_model, s.model, s.seed, str(s.init_dir), s.init_from)

    def train(self, shards: PrefectFuture, hellaswag: Future, init: PrefectFuture) -> PrefectFuture:
        s = self.s
        task_obj = train.with_options(timeout_seconds=s.train_timeout_s) if s.train_timeout_s else train
        return self._submit("train", task_obj, shards, hellaswag, init, s.seed, s.train, str(s.runs_dir), s.nproc,
                            s.rendezvous, s.launcher, s.slurm)

    def evaluate(self, run: PrefectFuture, shards: PrefectFuture, hellaswag: Future) -> PrefectFuture:
        checkpoint = run.result().checkpoint
        return self._submit("evaluate", evaluate_checkpoint, checkpoint, shards, hellaswag, self.s.eval)

    def sample(self, run: PrefectFuture) -> PrefectFuture:
        s = self.s
        return self._submit("sample", sample, run.result().checkpoint, s.training_value("sample_prompt"),
                            s.num_samples, s.training_value("sample_tokens"), s.seed, s.eval.device)

    def export(self, run: PrefectFuture) -> PrefectFuture:
        return self._submit("export", export_hf, run.result().checkpoint)


def _results(futures: dict[str, Future]) -> dict[str, StageRecord | None]:
    return {name: None if future is None else future.result() for name, future in futures.items()}


def ends_cancelled(body: Callable[..., Any]) -> Callable[..., Any]:
    """A flow body whose work was stopped because its run was cancelled (tasks.cancel_watch) returns Prefect's
    Cancelled state, so the run ends Cancelled rather than Failed; any other exception propagates."""
    @functools.wraps(body)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return body(*args, **kwargs)
        except Exception:
            if not cancel_requested(flow_run.get_id()):
                raise
            return Cancelled(message="Flow run was cancelled: its work was stopped and no later stage ran.")

    return run


@flow(name=PIPELINE_FLOW, log_prints=True)
@ends_cancelled
@settings_parameters()
def gpt2_pretrain(**parameters: Any) -> dict[str, StageRecord | None]:
    """Every stage: download -> tokenize, HellaSwag, init -> train -> final evaluation and samples."""
    s = resolved_settings(parameters)
    stages = Stages(s)
    with stop_children_on_exit(), stages.root_cause():
        hellaswag = stages.hellaswag()
        init = stages.init()
        docs = stages.download()
        shards = stages.tokenize(docs)
        run = stages.train(shards, hellaswag, init)
        evaluation = stages.evaluate(run, shards, hellaswag)
        samples = stages.sample(run)
        hf_export = stages.export(run)
        records = _results(dict(download=docs, tokenize=shards, hellaswag=hellaswag, init=init, train=run,
                                evaluate=evaluation, sample=samples, export=hf_export))
    _summary_artifact(s, records["train"], records["evaluate"])
    _log_outputs("run folder", records["train"], records["evaluate"])
    return records


def _log_outputs(label: str, record: StageRecord | None, evaluation: EvalRecord | None = None) -> None:
    """Log where `record`'s output is (a run: its folder, loss curve and TensorBoard command) and, for a trained
    run, its final val loss and HellaSwag accuracy (`evaluation`'s, else the training's own last evaluation), as
    the `output:` lines flows.watch shows as the run's last lines."""
    if record is None:
        return
    logger = get_run_logger()
    lines = {label: output_path(record)}
    if isinstance(record, TrainRecord):
        val_loss = evaluation.val_loss if evaluation is not None else record.val_loss
        lines["val loss"] = "none measured" if val_loss is None else f"{val_loss:.4f} at step {record.steps}"
        hellaswag = evaluation.hellaswag if evaluation is not None else None
        if hellaswag:
            lines["HellaSwag"] = f"acc_norm {hellaswag['acc_norm']:.4f} over {hellaswag['n']:g} examples"
        lines["loss curve"] = record.loss_curve
        lines["TensorBoard"] = f"{Path(sys.executable).with_name('tensorboard')} --logdir {record.run_dir}"
    for name, value in lines.items():
        logger.info(f"{OUTPUT_PREFIX}{name}: {value}")


def output_path(record: StageRecord) -> str:
    """The folder (or file) a stage's record names as its output: a run's folder, the shards', the documents',
    the HellaSwag file, a checkpoint, an export; else the folder holding its files (samples)."""
    for field in ("run_dir", "out_dir", "path"):
        if (value := getattr(record, field, None)) is not None:
            return str(value)
    return os.path.commonpath([f.path for f in record.files]) if record.files else "nothing written"


def _summary_artifact(s: PipelineSettings, run: TrainRecord, evaluation: Any) -> None:
    hellaswag = evaluation.hellaswag["acc_norm"] if evaluation.hellaswag else None
    figures = {"train_loss": run.train_loss, "val_loss": evaluation.val_loss, "tokens_per_s": run.tokens_per_s,
               "mfu": run.mfu}
    best_effort(
        "the run summary artifact", create_markdown_artifact,
        run_summary_markdown(f"gpt2-pretrain: {s.run_name}", run.run_dir, run.steps, run.tokens, figures,
                             hellaswag, run.loss_curve),
        key="gpt2-pretrain-summary", description="the run beside the reference points",
    )


def run_stage(settings: PipelineSettings, stage: str, force: bool = False) -> dict[str, StageRecord | None]:
    """Run `stage` and the stages it needs (INPUTS); returns the records of every stage that ran, by name."""
    stages = Stages(settings, force=stage if force else None)
    futures: dict[str, Future] = {}

    def submit(name: str) -> Future:
        if name not in futures:
            futures[name] = getattr(stages, name)(*[submit(needed) for needed in INPUTS[name]])
        return futures[name]

    with stages.root_cause():
        submit(stage)
        records = _results(futures)
    _log_outputs(f"{stage} made", records[stage], records.get("evaluate"))
    return records


def _stage_flow(stage: str, name: str):
    force_parameter = inspect.Parameter("force", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=bool)

    @ends_cancelled
    @settings_parameters(extra=(force_parameter,))
    def stage_flow(force: bool = False, **parameters: Any) -> dict[str, StageRecord | None]:
        settings = resolved_settings(parameters)
        with stop_children_on_exit():
            return run_stage(settings, stage, force)

    stage_flow.__doc__ = f"The {stage} stage alone (what it needs comes from cache); force=True reruns it."
    stage_flow.__name__ = f"{stage}_flow"
    return flow(name=name, log_prints=True)(stage_flow)


# The stage flows (flows.names.STAGE_FLOWS), made when first looked up (`from flows.pipeline import train_flow`,
# a deployment's entrypoint), not at import: Prefect builds a flow's parameter schema, a pydantic model per
# parameter, when the flow is made (about 60 ms of CPU for the settings' ~55 parameters), and a flow run needs
# one of the eight.
def __getattr__(name: str) -> Any:
    if name not in STAGE_FLOWS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    made = globals()[name] = _stage_flow(*STAGE_FLOWS[name])
    return made


# ---------------------------------------------------------------------------------------------------------
# scheduled evaluation


@flow(name=SCAN_FLOW, log_prints=True)
def gpt2_evaluate(runs_dir: str = "artifacts/runs", settings: EvalSettings = EvalSettings()) -> list[dict[str, Any]]:
    """Evaluate every complete checkpoint under `runs_dir` that has not been evaluated yet.

    A checkpoint counts as evaluated once its run's evaluations/ folder holds a result for its exact
    content; results go to the run's TensorBoard log (at the checkpoint's step) and a table artifact, where
    a checkpoint or run that could not be evaluated has a row saying why (tasks.evaluate.scan_runs).
    """
    with stop_children_on_exit():
        rows = scan_runs(runs_dir, settings)
    best_effort("the evaluations table artifact", create_table_artifact, rows, key="gpt2-evaluations",
                description=f"checkpoints under {runs_dir}")
    return rows
