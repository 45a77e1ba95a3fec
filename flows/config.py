"""The pipeline's settings: every flow parameter, typed, one level deep, and where each stage puts its output.

The flows take each setting as a parameter of its own (`root`, `source`, ..., `max_steps`, `lr`, ...),
so `prefect deployment run gpt2-pretrain/smoke --param max_steps=30` changes one value and keeps every
other value of the deployment. The training fields are generated from `gpt2.train_config.TrainConfig`
(one owner): a field added there is a pipeline parameter at once. Their default, None, means
"gpt2.train's default".

`eval`, `rendezvous` and `slurm` are the only nested parameters; a partial value (`--param eval='{"device": "cpu"}'`)
is merged into the deployment's, field by field (`merge_with_deployment`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, create_model, field_validator

from common.bounds import value_problem
from common.files import PID_MAX_LIMIT, temporary_name
from common.paths import NAME_MAX_BYTES, check_name, under

from data.hellaswag import HELLASWAG_VAL_URL
from data.shards import DEFAULT_SHARD_SIZE, MAX_SHARD_SIZE, check_num_workers, check_shard_size, shard_filename
from gpt2.train_config import WIRED_FIELDS, TrainConfig
from tasks.evaluate import EvalSettings
from tasks.launch import Rendezvous
from tasks.slurm import JOB_NAME_MAX_BYTES, SlurmSettings, job_name_for
from tasks.train import RUN_ID_LENGTH, world_shape


class _PipelineFields(BaseModel):
    """Defaults: llm.c's GPT-2 (124M) run on FineWeb sample-10BT. Every output goes under `root`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    root: str = Field("artifacts", description="every output goes under this folder (a path)")
    run_name: str = Field("gpt2-124m", description="runs go to root/runs/<run_name>/<run id>/ (a name, not a path)")
    # documents and shards
    source: str = Field("HuggingFaceFW/fineweb",
                        description="hub dataset id, or a local folder/file of parquet/jsonl documents (offline)")
    source_config: Optional[str] = Field("sample-10BT", description="hub dataset config; null for a local source")
    source_revision: Optional[str] = Field(None, description="hub branch, tag or commit sha to download (default: the main "
                                    "branch); resolved to a commit once and recorded")
    limit: Optional[int] = Field(None, ge=1, description="use only the first `limit` documents")
    dataset: str = Field("fineweb10B", description="shard name prefix and folder name (a name, not a path)")
    shard_size: int = Field(DEFAULT_SHARD_SIZE, description=f"tokens per shard (1 to {MAX_SHARD_SIZE})")
    tokenize_workers: Optional[int] = Field(None, description="tokenizer processes, at most the cores (default: all)")
    hellaswag_source: Optional[str] = Field(HELLASWAG_VAL_URL, description="URL or local jsonl; null: no HellaSwag")
    # model
    model: str = Field("d12", description="model descriptor (d12, ...) or 'n_layer=..,n_head=..,n_embd=..,block_size=..'")
    seed: int = Field(42, description="seed of the weight init (PyTorch RNG order), of the llmc train order and of sampling")
    init_from: Optional[str] = Field(
        None, description="weights to start from instead of llm.c's init: one of our checkpoints, a run directory "
        "(its newest checkpoint that verifies), an llm.c model file or a Hugging Face GPT-2 directory (its shape must "
        "be `model`'s); the init stage records their content")
    # launching
    nproc: Optional[int] = Field(None, ge=1, description="processes per node; default one per visible GPU, else 1")
    rendezvous: Rendezvous = Field(Rendezvous(), description="torchrun across machines (docs/pipeline.md)")
    launcher: Literal["local", "slurm"] = Field(
        "local", description="where training runs: 'local', torchrun on the worker's host; 'slurm', one Slurm job "
        "of slurm.nodes nodes, one torchrun each (docs/pipeline.md, Beyond one machine)")
    slurm: SlurmSettings = Field(SlurmSettings(), description="the Slurm job of launcher=slurm: partition, account, "
                                 "time_limit, nodes, gpus_per_node, sbatch_options, setup, ...")
    train_timeout_s: Optional[float] = Field(None, gt=0, allow_inf_nan=False,
                                             description="kill training after this long (not retried)")
    # final evaluation and samples (prompt and length: the training settings sample_prompt, sample_tokens)
    eval: EvalSettings = Field(EvalSettings(), description="how checkpoints are evaluated")
    num_samples: int = Field(4, ge=1, description="samples of the final checkpoint")

    @field_validator("run_name", "dataset")
    @classmethod
    def _a_name_not_a_path(cls, value: str, info: Any) -> str:
        """Names become folder and file names under `root`: refuse anything that would climb out of it, and a
        name whose longest derived name a stage could not make."""
        check_name(value, info.field_name)
        _check_derived_names(info.field_name, value)
        return value

    @field_validator("shard_size")
    @classmethod
    def _a_shard_that_fits(cls, value: int) -> int:
        check_shard_size(value)  # data.shards' own bound, checked before the shard folder is touched
        return value

    @field_validator("tokenize_workers")
    @classmethod
    def _workers_the_cores_can_run(cls, value: int | None) -> int | None:
        check_num_workers(value, "tokenize_workers")
        return value


def _training_fields() -> dict[str, Any]:
    """TrainConfig's fields, less those the pipeline wires itself, as optional pydantic fields; None: gpt2.train's
    default."""
    types = typing.get_type_hints(TrainConfig)
    fields = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name in WIRED_FIELDS:
            continue
        description = f"{f.metadata['help']} (gpt2.train default: {f.default})"
        annotation = Optional[types[f.name]]
        if types[f.name] is float:
            # JSON has no NaN or infinity: a client sends them as null, which would silently mean "the default".
            # The run's parameter schema (checked by the server) takes a number only; leaving it out is the default.
            annotation = Annotated[annotation, WithJsonSchema({"type": "number", "description": description})]
        fields[f.name] = (annotation, Field(None, description=description))
    return fields


class PipelineSettings(create_model("_Settings", __base__=_PipelineFields, **_training_fields())):
    """Every setting of the pipeline: its own fields, then gpt2.train's (TrainConfig) fields."""

    @property
    def train(self) -> dict[str, Any]:
        """The training settings given (TrainConfig fields); the others keep gpt2.train's defaults."""
        return {name: getattr(self, name) for name in training_setting_names() if getattr(self, name) is not None}

    def training_value(self, name: str) -> Any:
        """A training setting as gpt2.train will see it: the value given, else its default."""
        value = getattr(self, name)
        return getattr(TrainConfig(), name) if value is None else value

    # Every output folder, resolved under `root` by the path policy (common.paths.under): a folder that a
    # symbolic link takes out of `root` raises PathOutsideRoot (check_settings names the setting).

    @property
    def documents_dir(self) -> Path:
        return under(self.root, "data", self.dataset, "documents")

    @property
    def shards_dir(self) -> Path:
        return under(self.root, "data", self.dataset, "shards")

    @property
    def hellaswag_dir(self) -> Path:
        """One folder per source: eval files of different sources never share (nor overwrite) a folder."""
        source = str(self.hellaswag_source)
        digest = hashlib.sha256(source.encode()).hexdigest()[:12]
        return under(self.root, "eval", "hellaswag", f"{_slug(Path(source).stem)}-{digest}")

    @property
    def init_dir(self) -> Path:
        return under(self.root, "init", f"{_slug(self.model)}-seed{self.seed}")

    @property
    def runs_dir(self) -> Path:
        return under(self.root, "runs", self.run_name)


# the output folders and the setting that names each (what an error about the folder points at)
OUTPUT_FOLDERS = {"documents_dir": "dataset", "shards_dir": "dataset", "hellaswag_dir": "hellaswag_source",
                  "init_dir": "model", "runs_dir": "run_name"}


def longest_derived_names(setting: str, name: str) -> list[tuple[str, int]]:
    """The names the stages make of `name` given as `setting` (run_name or dataset), each at its longest, with
    the most bytes it may have. A stage that derives a new name from either adds it here; the bound on the
    setting follows (`_check_derived_names`)."""
    if setting == "dataset":  # data/<dataset>/, and a shard being written (any index to 999999 is as long as 1)
        return [(name, NAME_MAX_BYTES), (temporary_name(shard_filename(name, 1), PID_MAX_LIMIT), NAME_MAX_BYTES)]
    # runs/<run_name>/, and the Slurm job that trains one of its runs
    return [(name, NAME_MAX_BYTES), (job_name_for(name, "0" * RUN_ID_LENGTH), JOB_NAME_MAX_BYTES)]


def _check_derived_names(setting: str, name: str) -> None:
    """ValueError naming `setting`, the longest name it allows and the derived name that does not fit."""
    size = len(name.encode())
    for derived, limit in longest_derived_names(setting, name):
        if len(derived.encode()) > limit:
            allowed = limit - (len(derived.encode()) - size)
            raise ValueError(f"{setting} may have at most {allowed} bytes, got {size}: the stages make "
                             f"{derived.replace(name, f'<{setting}>', 1)!r} of it, {len(derived.encode())} bytes, "
                             f"more than the {limit} it may have; choose a shorter {setting}")


def _slug(text: str) -> str:
    """`text` as a folder name: runs of anything but letters and digits become one dash."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


def training_setting_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig) if f.name not in WIRED_FIELDS]


class SettingsError(ValueError):
    """A setting that cannot work; the message names the parameter and what is wrong."""


def settings_parameters(extra: tuple[inspect.Parameter, ...] = ()) -> Callable[[Callable], Callable]:
    """Give a flow function `fn(**parameters)` the signature of PipelineSettings' fields (keyword-only).

    Prefect builds the parameter form, the schema the server checks runs against and the binding of a
    run's parameters from this signature, so every setting is a typed parameter of its own, with its field's
    metadata (bounds, the JSON schema of a float training setting) as the settings model has it.
    """
    def decorate(fn: Callable) -> Callable:
        params = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=field.default,
                                    annotation=Annotated[field.annotation, *field.metadata] if field.metadata
                                    else field.annotation)
                  for name, field in PipelineSettings.model_fields.items()]
        fn.__signature__ = inspect.Signature([*params, *extra])
        return fn

    return decorate


def merge_with_deployment(parameters: dict[str, Any], deployment: dict[str, Any] | None) -> dict[str, Any]:
    """A run's parameters over its deployment's, nested ones (`eval`, `rendezvous`, `slurm`) merged field by field.

    Prefect merges a run's parameters into its deployment's one level deep, so `--param eval='{...}'`
    would replace the deployment's whole `eval`; this restores the deployment's other fields.
    """
    merged = dict(parameters)
    for name, value in (deployment or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(name), dict):
            merged[name] = {**value, **merged[name]}
    return merged


def check_settings(parameters: dict[str, Any]) -> PipelineSettings:
    """Validate every setting, training ones included, before any stage runs; errors name the parameter."""
    try:
        settings = PipelineSettings.model_validate(parameters)
    except ValidationError as e:
        problems = [f"{'.'.join(map(str, err['loc']))}: {err['msg']} (got {err.get('input')!r})" for err in e.errors()]
        raise SettingsError("invalid pipeline settings:\n  - " + "\n  - ".join(problems)) from None
    _check_values(settings)
    _check_output_folders(settings)
    _check_training(settings)
    return settings


def _check_values(settings: PipelineSettings) -> None:
    """Every value of the pipeline's own settings, nested ones and lists included, within common.bounds: text
    without control characters (the Slurm setup's shell lines may span lines), integers within int64, floats
    finite. The training settings are gpt2.train_config.validate's (`_check_training`), with their own types."""
    problems = [problem for name in _PipelineFields.model_fields for problem in _problems(name, getattr(settings, name))]
    if problems:
        raise SettingsError("invalid pipeline settings:\n  - " + "\n  - ".join(problems))


def _problems(name: str, value: Any, multiline: bool = False) -> list[str]:
    """common.bounds' verdict on `value` and on every value inside it (a nested setting's fields, a list's items),
    each named by its path (`slurm.sbatch_options[1]`)."""
    if dataclasses.is_dataclass(value):
        return [problem for f in dataclasses.fields(value)
                for problem in _problems(f"{name}.{f.name}", getattr(value, f.name), f.metadata.get("multiline", False))]
    if isinstance(value, (list, tuple)):
        return [problem for i, item in enumerate(value) for problem in _problems(f"{name}[{i}]", item)]
    problem = value_problem(name, value, multiline=multiline)
    return [problem] if problem else []


def _check_output_folders(settings: PipelineSettings) -> None:
    """Every output folder stays under `root` (common.paths); errors name the setting that names the folder."""
    problems = []
    for folder, setting in OUTPUT_FOLDERS.items():
        try:
            getattr(settings, folder)
        except ValueError as e:  # PathOutsideRoot, or a folder name made too long by the setting
            problems.append(f"{setting}: {e}")
    if problems:
        raise SettingsError("invalid pipeline settings:\n  - " + "\n  - ".join(problems))


def _check_training(settings: PipelineSettings) -> None:
    """gpt2.train's own checks (batch divisibility, warmup <= steps, model shape, ...) on the settings.

    The shards, the eval file and init_from's weights are not checked here (they may not exist before their
    stages run): the train stage checks them again with the real files.
    """
    from gpt2.train_config import validate_train_settings

    # the HellaSwag file's path is not known yet; only whether there is one matters (the vocabulary check)
    hellaswag = str(settings.hellaswag_dir) if settings.hellaswag_source else None
    nproc, nnodes = world_shape(settings.launcher, settings.nproc, settings.rendezvous, settings.slurm)
    validate_train_settings(settings.train, nproc * nnodes,
                            wired={"model": settings.model, "seed": settings.seed, "hellaswag": hellaswag})
