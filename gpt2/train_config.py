"""The training run's one typed config: defaults are llm.c's GPT-2 (124M) recipe.

Values come from, in increasing priority: the dataclass defaults, a JSON or YAML file (`--config`),
and command-line flags (`--batch-size 32`, `--no-compile`). `validate` checks everything that can be
checked before any work starts and names what to change.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import glob
import json
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Sequence

from common.bounds import FLOAT_MAX, number_problem, value_problem
from common.files import utf8_text
from common.limits import gigabytes, physical_memory
from data.loader import ORDERS
from gpt2.config import DEVICES, DTYPES, VOCAB_SIZE, GPTConfig, parse_model_spec

LR_SCHEDULES = ("cosine", "linear", "constant", "wsd")
# the fields a pipeline fills in from its own parameters and stages, never from its training settings
WIRED_FIELDS = ("model", "seed", "train_data", "val_data", "hellaswag", "out_dir", "init_from")
MODEL_FILE_DTYPES = ("float32", "bfloat16")


class ConfigError(ValueError):
    """A config value that cannot work; the message says which field and what to change."""


def _opt(default: Any, help: str, held_in: str | None = None, multiline: bool = False) -> Any:
    """A field with its help; `held_in`: the type its value is used in, when narrower than int64 / float64 (the
    bound `validate` checks, common.bounds); `multiline`: text that may hold newlines and tabs."""
    return field(default=default, metadata={"help": help, "held_in": held_in, "multiline": multiline})


@dataclass
class TrainConfig:
    # model
    model: str = _opt(
        "d12",
        "model descriptor (d6 d12 d24 d36 d48 gpt3:c768 ...) or explicit shape "
        "'n_layer=2,n_head=2,n_embd=64,block_size=64,vocab_size=256'",
    )
    seed: int = _opt(42, "seed of the weight init (PyTorch RNG order), of the llmc train order and of sampling",
                     held_in="uint64")  # what torch.manual_seed takes (llm.c's mt19937 uses its low 32 bits)
    init_from: str | None = _opt(
        None,
        "weights to start from when out_dir has no checkpoint to resume: one of our checkpoints, an llm.c "
        "model file or a Hugging Face GPT-2 directory (its shape must be --model's); unset: llm.c's init "
        "from --seed",
    )
    # data
    train_data: str = _opt("artifacts/data/fineweb10B/shards/*_train_*.bin",
                           "glob of the training token shards, or a shard folder's manifest.json (its train shards)")
    val_data: str = _opt("artifacts/data/fineweb10B/shards/*_val_*.bin",
                         "glob of the validation token shards, or a shard folder's manifest.json (its val shards)")
    hellaswag: str | None = _opt(None, "HellaSwag eval file (data.hellaswag); unset: no HellaSwag eval")
    train_order: str = _opt(
        "llmc",
        "order of the training batches: llmc (llm.c's train_gpt2.cu: each epoch shuffles the shards, and each "
        "shard's samples, with its mt19937 seeded --seed + rank) or file (shards in sorted-glob order, samples "
        "front to back); validation always reads in file order",
    )
    out_dir: str = _opt("artifacts/runs/gpt2-124m", "run directory: checkpoints, metrics.jsonl, tensorboard/")
    # batch
    batch_size: int = _opt(64, "micro-batch size B per rank")
    seq_len: int = _opt(1024, "sequence length T")
    total_batch_size: int = _opt(524288, "tokens per optimizer step; a multiple of B*T*world_size")
    max_steps: int = _opt(18865, "optimizer steps (18865 x 524288 tokens = 10B tokens)")
    # optimizer and schedule
    lr: float = _opt(6e-4, "peak learning rate", held_in="float32")  # AdamW's scalars meet float32 tensors
    lr_schedule: str = _opt("cosine", f"shape after warmup: {', '.join(LR_SCHEDULES)}")
    warmup_steps: int = _opt(700, "linear warmup steps")
    final_lr_frac: float = _opt(0.0, "learning rate at the last step as a fraction of lr")
    decay_frac: float = _opt(0.2, "wsd only: fraction of all steps spent in the final decay")
    weight_decay: float = _opt(0.1, "AdamW weight decay, applied to 2-D tensors only", held_in="float32")
    beta1: float = _opt(0.9, "AdamW beta1", held_in="float32")
    beta2: float = _opt(0.95, "AdamW beta2", held_in="float32")
    eps: float = _opt(1e-8, "AdamW epsilon", held_in="float32")
    grad_clip: float = _opt(1.0, "clip the global grad norm to this; 0 disables clipping")
    # evaluation
    val_every: int = _opt(250, "val loss every N steps and at the end; 0 disables")
    val_steps: int = _opt(20, "batches of B x T per rank in one val loss evaluation")
    hellaswag_every: int = _opt(250, "HellaSwag every N steps and at the end (needs --hellaswag); 0 disables")
    sample_every: int = _opt(250, "print a text sample every N steps and at the end; 0 disables")
    sample_tokens: int = _opt(64, "tokens generated per sample")
    sample_prompt: str = _opt("Hello, I'm a language model,", "fixed prompt of the samples (top-k 50)",
                              multiline=True)
    # checkpoints
    checkpoint_every: int = _opt(1000, "checkpoint every N steps and at the end; 0: only at the end")
    keep_last: int = _opt(3, "complete checkpoints kept; older ones are deleted (step 0 is always kept)")
    resume: bool = _opt(True, "continue from the newest checkpoint in out_dir that verifies")
    model_file_dtype: str = _opt("float32", "dtype of the llm.c model file written with each checkpoint")
    # outlier guard
    guard_window: int = _opt(128, "window of the rolling loss and grad-norm z-scores")
    skip_loss_z: float = _opt(0.0, "skip an update whose loss z-score exceeds this; 0 disables")
    skip_norm_z: float = _opt(0.0, "skip an update whose grad-norm z-score exceeds this; 0 disables")
    max_bad_steps: int = _opt(10, "abort after this many skipped (non-finite or outlier) steps in a row")
    # runtime
    device: str = _opt("auto", "auto (cuda if available), cuda or cpu")
    dtype: str = _opt("auto", "autocast dtype of the forward pass: auto (bfloat16 on CUDA, float32 on CPU), "
                      "bfloat16 or float32; weights, gradients and optimizer state are float32 tensors")
    compile: bool | None = _opt(None, "torch.compile the model; default: on for CUDA, off for CPU")
    kernels: bool | None = _opt(None, "use the fused kernels of gpt2_kernels/; default: on for CUDA")
    cuda_graphs: bool | None = _opt(None, "replay each micro-step as a CUDA graph (CUDA; under torchrun the "
                                    "gradients are then averaged in one all-reduce per step instead of by "
                                    "DDP); default: on where compile is on CUDA")
    master_weights: bool | None = _opt(
        None, "llm.c's -w: AdamW updates float32 master weights and the forward pass reads them stochastically "
        "rounded to bfloat16; off: the forward casts the float32 weights round-to-nearest; default: on when the "
        "forward computes in bfloat16")
    zero1: bool = _opt(False, "ZeRO-1: shard the AdamW state across the DDP ranks (each holds 1/world of it); "
                       "no effect on one process")
    keep_mlp_post_gb: float = _opt(2.5, "GB of GPU memory the MLPs may spend keeping their GELU output for "
                                   "backward instead of recomputing it (kernels with the gpu extra), the first "
                                   "layers as many as fit; d12 at B=64: 0.4 GB a layer, about 1 ms a step each, so "
                                   "the default keeps 6 of 12; 0: none")
    log_every: int = _opt(1, "print a log line every N steps (metrics.jsonl gets every step)")
    peak_flops: float = _opt(0.0, "peak FLOP/s for MFU; 0: the GPU's bf16 dense peak when known")

    def model_config(self) -> GPTConfig:
        return parse_model_spec(self.model)

    def grad_accum_steps(self, world_size: int) -> int:
        return self.total_batch_size // (self.batch_size * self.seq_len * world_size)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------------------------
# loading: defaults <- file <- command line


def _field_types() -> dict[str, tuple[type, bool]]:
    """Field name -> (the Python type its values must have, whether None is allowed)."""
    out = {}
    for name, hint in typing.get_type_hints(TrainConfig).items():
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        (base,) = [a for a in args if a is not type(None)]
        out[name] = (base, type(None) in args)
    return out


def _coerce(name: str, value: Any, expected: type, optional: bool, source: str) -> Any:
    """Check a value read from a config file against the field's type. Ints are fine for floats, and so is
    text that reads as a number: PyYAML reads `lr: 6e-4` (no dot in the mantissa) as the string '6e-4'."""
    if value is None and optional:
        return None
    if expected is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{source}: {name} must be a number, got {value!r}") from None
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, expected) and not (expected is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"{source}: {name} must be {expected.__name__}, got {value!r}")


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON or YAML (.yaml/.yml) file holding a flat mapping of TrainConfig fields."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path} does not exist")
    if path.endswith((".yaml", ".yml")):
        import yaml

        parse, parse_error = yaml.safe_load, yaml.YAMLError
    else:
        parse, parse_error = json.loads, json.JSONDecodeError
    with open(path, "rb") as f:
        text = utf8_text(f.read(), path, ConfigError)  # never the locale's encoding, and a bad byte named
    try:
        values = parse(text)
    except parse_error as e:
        raise ConfigError(f"{path}: cannot parse it: {e}") from None
    values = {} if values is None else values  # an empty YAML file
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of config fields, got {type(values).__name__}")
    return config_values(values, path)


def config_values(values: dict[str, Any], source: str) -> dict[str, Any]:
    """TrainConfig field values checked and coerced to their fields' types; errors name `source` and the field."""
    field_types = _field_types()
    out = {}
    for key, value in values.items():
        if key not in field_types:
            close = difflib.get_close_matches(key, list(field_types), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{source}: unknown config field {key!r}{hint}")
        out[key] = _coerce(key, value, *field_types[key], source)
    return out


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpt2.train",
        description="Train GPT-2 (llm.c recipe). Single process or `torchrun --nproc_per_node=N -m gpt2.train`.",
    )
    parser.add_argument("--config", help="JSON or YAML file of config fields; flags override it")
    field_types = _field_types()
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} (default: {f.default})".replace("%", "%%")
        # SUPPRESS: only flags actually given override the file's values
        kwargs: dict[str, Any] = dict(dest=f.name, help=help_text, default=argparse.SUPPRESS)
        base, _ = field_types[f.name]
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = base
        parser.add_argument(flag, **kwargs)
    return parser


def load_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """TrainConfig from defaults, then `--config FILE`, then the other flags of `argv`."""
    args = vars(build_arg_parser().parse_args(argv))
    config_path = args.pop("config", None)
    values = read_config_file(config_path) if config_path else {}
    values.update(args)
    return TrainConfig(**values)


# ----------------------------------------------------------------------------------------------------
# validation


def validate(config: TrainConfig, world_size: int = 1, check_inputs: bool = True) -> GPTConfig:
    """Raise ConfigError listing every problem (each with what to change); returns the model shape.

    check_inputs=False skips the checks of files (shards, HellaSwag, init_from) that may not exist yet,
    e.g. when a pipeline validates its settings before the stages that make those files have run.
    """
    problems: list[str] = []
    try:
        model = config.model_config()
    except ValueError as e:
        raise ConfigError(str(e)) from None

    problems += _value_problems(config)
    positive = ("batch_size", "seq_len", "total_batch_size", "max_steps", "val_steps", "keep_last", "guard_window",
                "max_bad_steps", "log_every", "sample_tokens", "eps")
    non_negative = ("warmup_steps", "val_every", "hellaswag_every", "sample_every", "checkpoint_every", "lr",
                    "weight_decay", "grad_clip", "skip_loss_z", "skip_norm_z", "peak_flops", "keep_mlp_post_gb")
    problems += [f"{n} must be > 0, got {getattr(config, n)}" for n in positive if getattr(config, n) <= 0]
    problems += [f"{n} must be >= 0, got {getattr(config, n)}" for n in non_negative if getattr(config, n) < 0]

    micro = config.batch_size * config.seq_len * world_size
    if micro > 0 and config.total_batch_size % micro:
        problems.append(
            f"total_batch_size={config.total_batch_size} is not a multiple of batch_size*seq_len*world_size = "
            f"{config.batch_size}*{config.seq_len}*{world_size} = {micro}; set total_batch_size to a multiple "
            f"of {micro} (e.g. {max(1, round(config.total_batch_size / micro)) * micro}) or change B/T"
        )
    problems += _memory_problems(config, model)
    if config.seq_len > model.block_size:
        problems.append(f"seq_len={config.seq_len} exceeds the model's max_seq_len {model.block_size}; "
                        f"use --seq-len {model.block_size} or less")
    if config.warmup_steps > config.max_steps:
        problems.append(f"warmup_steps={config.warmup_steps} exceeds max_steps={config.max_steps}; "
                        "lower --warmup-steps or raise --max-steps")
    for name, value, allowed in (("lr_schedule", config.lr_schedule, LR_SCHEDULES), ("dtype", config.dtype, DTYPES),
                                 ("model_file_dtype", config.model_file_dtype, MODEL_FILE_DTYPES),
                                 ("device", config.device, DEVICES), ("train_order", config.train_order, ORDERS)):
        if value not in allowed:
            problems.append(f"{name}={value!r} is not one of {', '.join(allowed)}")
    for name in ("final_lr_frac", "decay_frac"):
        if not 0.0 <= getattr(config, name) <= 1.0:
            problems.append(f"{name} must lie in [0, 1], got {getattr(config, name)}")
    if not (0 <= config.beta1 < 1 and 0 <= config.beta2 < 1):
        problems.append(f"beta1/beta2 must lie in [0, 1), got {config.beta1}/{config.beta2}")
    if config.cuda_graphs and config.device == "cpu":
        problems.append("cuda_graphs needs a CUDA device, this run is on the CPU; drop --cuda-graphs")

    if model.vocab_size != VOCAB_SIZE:  # samples and HellaSwag are GPT-2 tokens
        uses_tokenizer = {"sample_every": config.sample_every,
                          "hellaswag_every": config.hellaswag_every if config.hellaswag else 0}
        for name, every in uses_tokenizer.items():
            if every:
                problems.append(f"{name}={every} needs the GPT-2 tokenizer's vocabulary ({VOCAB_SIZE}), the model "
                                f"has {model.vocab_size}; pass --{name.replace('_', '-')} 0")
    if check_inputs:
        problems += _input_problems(config)
    if problems:
        raise ConfigError("invalid training config:\n  - " + "\n  - ".join(problems))
    return model


def _value_problems(config: TrainConfig) -> list[str]:
    """Values the code below them cannot take (common.bounds): text with control characters (a prompt may
    span lines), NaN or infinite floats, numbers beyond the type they are used in (int64 unless a field says
    narrower: the seed within what torch.manual_seed takes, AdamW's hyperparameters within float32), and
    AdamW's first step size. Checked for every field, so a field added later is bounded too."""
    problems = [problem for f in dataclasses.fields(config)
                if (problem := value_problem(f.name, getattr(config, f.name), f.metadata["held_in"],
                                             f.metadata["multiline"]))]
    return problems + _adamw_step_problems(config)


def _adamw_step_problems(config: TrainConfig) -> list[str]:
    """AdamW scales its first update by lr / (1 - beta1) (bias correction; later steps by less), a scalar it
    applies to float32 tensors: beyond float32, every attempt fails as it does for an lr beyond float32."""
    if not 0 <= config.beta1 < 1 or number_problem("lr", config.lr, "float32"):
        return []  # each reported on its own
    step = config.lr / (1 - config.beta1)
    if number_problem("step", step, "float32") is None:
        return []
    return [f"lr / (1 - beta1) = {config.lr} / (1 - {config.beta1}) = {step:.4g}, AdamW's first step size, is "
            f"beyond float32, the type it is used in (largest {FLOAT_MAX['float32']:.7g}); lower lr or beta1"]


def _memory_problems(config: TrainConfig, model: GPTConfig) -> list[str]:
    """The model's float32 weights must fit in this machine's memory: the init stage, evaluation, sampling and
    export build the whole model on the CPU. Counted from the shape alone, before anything is allocated."""
    needed = 4 * model.num_parameters
    if needed <= physical_memory():
        return []
    return [f"model={config.model!r} has {model.num_parameters:,} parameters, {gigabytes(needed)} of float32 "
            f"weights, more than this machine's {gigabytes(physical_memory())} of memory; choose a smaller model"]


def _input_problems(config: TrainConfig) -> list[str]:
    """What is wrong with the files the config names (shards, HellaSwag file, init_from)."""
    problems = []
    if not glob.glob(config.train_data):
        problems.append(f"train_data: no files match {config.train_data!r}; run the tokenize stage or "
                        "point --train-data at the *_train_*.bin shards")
    if config.val_every and not glob.glob(config.val_data):
        problems.append(f"val_data: no files match {config.val_data!r}; point --val-data at the *_val_*.bin "
                        "shards or pass --val-every 0")
    if config.hellaswag_every and config.hellaswag and not os.path.isfile(config.hellaswag):
        problems.append(f"hellaswag: file {config.hellaswag} does not exist; build it with data.hellaswag "
                        "or pass --hellaswag-every 0")
    if config.init_from and not os.path.exists(config.init_from):
        problems.append(f"init_from: {config.init_from} does not exist; point it at a checkpoint directory, an "
                        "llm.c model file or a Hugging Face GPT-2 directory")
    return problems


def validate_train_settings(settings: dict[str, Any], world_size: int = 1, wired: dict[str, Any] | None = None,
                            check_inputs: bool = False) -> TrainConfig:
    """The TrainConfig of a pipeline's training `settings` (TrainConfig fields over the defaults), checked as
    `validate` does; ConfigError names the field.

    wired: the fields the pipeline fills in itself (model, seed, data, out_dir, ...); settings must not set
    them. check_inputs: also check the files they name; off at flow start, before the stages made them.
    """
    wired = wired or {}
    if clash := sorted(set(WIRED_FIELDS) & set(settings)):
        raise ConfigError(f"train settings must not set {', '.join(clash)}: the pipeline wires them from its stages")
    config = TrainConfig(**config_values({**wired, **settings}, "train settings"))
    validate(config, world_size, check_inputs=check_inputs)
    return config
