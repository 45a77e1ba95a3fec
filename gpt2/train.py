"""GPT-2 pretraining (llm.c recipe): one process, or one process per GPU under torchrun.

    python -m gpt2.train --config run.yaml --max-steps 100
    torchrun --standalone --nproc_per_node=8 -m gpt2.train --train-data 'shards/*_train_*.bin' ...

Each optimizer step accumulates `total_batch_size / (B * T * world_size)` micro-batches; DDP all-reduces
gradients on the last one only. The run directory (`--out-dir`) gets config.json, metrics.jsonl,
tensorboard/ and checkpoints/ (gpt2.checkpoint); a run restarted in the same directory resumes from its
latest complete checkpoint and continues bit-exactly. See docs/training.md.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common.files import atomic_path, write_json
from data.loader import DistributedDataLoader
from gpt2 import checkpoint as ckpt
from gpt2 import evaluate
from gpt2 import step as step_fns
from gpt2.config import GPTConfig
from gpt2.distributed import (
    DistContext, all_reduce_mean, autocast_context, autocast_dtype, gather_objects, setup, teardown,
)
from gpt2.guard import OutlierGuard
from gpt2.model import GPT
from gpt2.optim import configure_optimizer, full_state_dict, lr_at
from gpt2.sample import sample_text
from gpt2.train_config import ConfigError, TrainConfig, load_config, validate

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

    def __init__(self, out_dir: Path, enabled: bool, start_step: int, max_steps: int):
        self.enabled = enabled
        self.path = out_dir / "metrics.jsonl"
        self.writer = None
        self.progress = None
        if not enabled:
            return
        self._truncate(start_step)
        self.file = open(self.path, "a")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(out_dir / "tensorboard"), purge_step=start_step)
        except ImportError:
            print("warning: tensorboard is not installed; no TensorBoard logs", file=sys.stderr, flush=True)
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.progress = tqdm(total=max_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def _truncate(self, start_step: int) -> None:
        """Drop records of steps >= start_step: a killed run may have logged past its last checkpoint
        (and, killed mid-write, left a partial last line)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line)["step"] < start_step:
                    kept.append(line)
            except json.JSONDecodeError:
                continue
        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(line + "\n" for line in kept))

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


def _resolve_flags(config: TrainConfig, device: torch.device) -> tuple[bool, bool]:
    """(compile, kernels): explicit values win, otherwise on for CUDA and off for the CPU."""
    on_cuda = device.type == "cuda"
    use_compile = on_cuda if config.compile is None else config.compile
    use_kernels = on_cuda if config.kernels is None else config.kernels
    return use_compile, use_kernels


def _starting_state(config: TrainConfig, model_config: GPTConfig) -> dict[str, Any] | None:
    """The checkpoint to start from: the latest one when resuming, else step 0 (the init stage's) if present."""
    out_dir = Path(config.out_dir)
    path = ckpt.latest_checkpoint(out_dir) if config.resume else None
    if path is None and ckpt.is_complete(ckpt.checkpoint_path(out_dir, 0)):
        path = ckpt.checkpoint_path(out_dir, 0)
    if path is None:
        return None
    state = ckpt.load_checkpoint(path)
    if (held := ckpt.model_config_of(state)) != model_config:
        raise ValueError(
            f"{path}: checkpoint holds model {held}, but the config asks for "
            f"{model_config} (--model {config.model}); use another --out-dir or the matching --model"
        )
    return state


def forward_backward(
    model: nn.Module, loader: Any, grad_accum: int, config: TrainConfig, ctx: DistContext
) -> tuple[float, float]:
    """Forward/backward over `grad_accum` micro-batches; returns (loss averaged over ranks, grad norm).

    The step itself is gpt2/step.py's (the benchmark and the numerics check call the same). Gradients
    are left in place, clipped: the caller decides whether to apply them.
    """
    batches = ((x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True))
               for x, y in (loader.next_batch() for _ in range(grad_accum)))
    loss = step_fns.forward_backward(model, batches, grad_accum, ctx.device, config.dtype)
    all_reduce_mean(loss, ctx)
    norm = step_fns.clip_gradients(model.parameters(), config.grad_clip)
    return loss.item(), norm.item()


@dataclass
class _Run:
    """What a training run is made of once built (or restored from a checkpoint)."""

    raw_model: GPT  # the plain module: state dicts, evaluation with varying shapes, sampling
    model: nn.Module  # what the training step calls: possibly compiled and DDP-wrapped
    optimizer: torch.optim.Optimizer
    guard: OutlierGuard
    train_loader: Any
    val_loader: Any | None
    start_step: int


def _build_run(config: TrainConfig, model_config: GPTConfig, ctx: DistContext, use_compile: bool,
               use_kernels: bool) -> _Run:
    """Model, optimizer, guard and loaders: fresh, from the init stage's step 0, or from the latest checkpoint."""
    state = _starting_state(config, model_config)
    if state is None:
        raw_model = GPT.create(model_config, seed=config.seed, device=ctx.device, use_kernels=use_kernels)
    else:
        raw_model = ckpt.model_from_state(state, ctx.device, use_kernels=use_kernels)
    optimizer = configure_optimizer(raw_model, config.lr, config.weight_decay, (config.beta1, config.beta2),
                                    config.eps, fused=ctx.device.type == "cuda",
                                    zero1=config.zero1 and ctx.is_distributed)
    guard = OutlierGuard(config.guard_window, config.skip_loss_z, config.skip_norm_z, config.max_bad_steps)
    B, T, rank, world = config.batch_size, config.seq_len, ctx.rank, ctx.world_size
    train_loader = DistributedDataLoader(config.train_data, B, T, rank, world, shuffle=config.shuffle, seed=config.seed)
    val_loader = DistributedDataLoader(config.val_data, B, T, rank, world) if config.val_every else None

    if state is not None and "optimizer" in state:  # step 0 holds only the model
        if state["world_size"] != world:
            raise ValueError(
                f"checkpoint step {state['step']} in {config.out_dir} was written by {state['world_size']} ranks, "
                f"this run has {world}; data-loader positions are per rank, so resume with the same world size"
            )
        optimizer.load_state_dict(state["optimizer"])
        guard.load_state_dict(state["guard"])
        train_loader.load_state_dict(state["loader"][rank])
        ckpt.restore_rng_state(state["rng"][rank])

    model: nn.Module = torch.compile(raw_model) if use_compile else raw_model
    if ctx.is_distributed:
        model = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    start_step = state["step"] if state is not None else 0
    return _Run(raw_model, model, optimizer, guard, train_loader, val_loader, start_step)


def _configure_cuda(config: TrainConfig, model_config: GPTConfig, ctx: DistContext, use_kernels: bool) -> str | None:
    """TF32 on, and with kernels the one checked attention backend pinned; returns its name (None on CPU)."""
    if ctx.device.type != "cuda":
        return None
    torch.backends.cuda.matmul.allow_tf32 = True  # TF32 for any float32 matmul left outside autocast
    torch.backends.cudnn.allow_tf32 = True
    if not use_kernels:
        return None
    from kernels import configure_sdpa

    # before the model is built and compiled: compiled graphs bake the backend in (kernels/attention.py)
    act_dtype = autocast_dtype(ctx.device, config.dtype)
    return configure_sdpa(model_config.n_head, model_config.head_size, dtype=act_dtype, device=ctx.device)


def train(config: TrainConfig, ctx: DistContext | None = None) -> dict[str, Any]:
    """Run (or resume) training as configured; returns the run summary (also written to summary.json)."""
    ctx = ctx or setup(config.device)
    model_config = validate(config, ctx.world_size)
    grad_accum = config.grad_accum_steps(ctx.world_size)
    use_compile, use_kernels = _resolve_flags(config, ctx.device)
    torch.manual_seed(config.seed)
    sdpa_backend = _configure_cuda(config, model_config, ctx, use_kernels)
    run = _build_run(config, model_config, ctx, use_compile, use_kernels)
    out_dir = Path(config.out_dir)

    num_params = run.raw_model.num_parameters()
    flops_per_step = flops_per_token(model_config, num_params, config.seq_len) * config.total_batch_size
    peak = peak_flops(ctx.device, config.peak_flops)
    if ctx.is_master:
        out_dir.mkdir(parents=True, exist_ok=True)
        resolved = {"world_size": ctx.world_size, "grad_accum_steps": grad_accum, "device": str(ctx.device),
                    "compile": use_compile, "kernels": use_kernels, "sdpa_backend": sdpa_backend,
                    "num_params": num_params, "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else None}
        write_json(out_dir / "config.json", {**config.to_dict(), "resolved": resolved})
    logger = MetricsLogger(out_dir, ctx.is_master, run.start_step, config.max_steps)
    logger.print(f"model {config.model}: {num_params:,} params | world {ctx.world_size} x B {config.batch_size} x "
                 f"T {config.seq_len} x grad_accum {grad_accum} = {config.total_batch_size:,} tokens/step | "
                 f"device {ctx.device} | compile {use_compile} | start step {run.start_step}/{config.max_steps}")

    summary: dict[str, Any] = {"out_dir": str(out_dir), "start_step": run.start_step}
    for step in range(run.start_step, config.max_steps + 1):
        last_step = step == config.max_steps
        summary.update(_evaluate_if_due(step, last_step, config, run, ctx, logger))
        if last_step:
            break

        t0 = time.perf_counter()
        lr = lr_at(step, config.lr, config.max_steps, config.warmup_steps, config.lr_schedule,
                   config.final_lr_frac, config.decay_frac)
        loss, norm = forward_backward(run.model, run.train_loader, grad_accum, config, ctx)
        decision = run.guard.check(loss, norm)  # same inputs on every rank -> same decision on every rank
        if decision.skip:
            logger.print(f"step {step + 1}: update skipped: {decision.reason}")
        step_fns.optimizer_step(run.optimizer, lr, skip=decision.skip)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()  # the step's kernels have finished: dt is the step's real time
        dt = time.perf_counter() - t0

        mfu = flops_per_step / dt / (peak * ctx.world_size) if peak else None
        record = {"step": step, "kind": "train", "loss": loss, "lr": lr, "norm": norm, "ms": dt * 1e3,
                  "tok_s": config.total_batch_size / dt, "mfu": mfu, "skipped": decision.skip,
                  "loss_z": decision.loss_z, "norm_z": decision.norm_z}
        if ctx.device.type == "cuda":
            record["peak_mem_gb"] = torch.cuda.max_memory_allocated(ctx.device) / 2**30
        show = (step + 1) % config.log_every == 0 or step == run.start_step or step + 1 == config.max_steps
        logger.log(record, "train", _step_line(record, config.max_steps) if show else None)
        logger.advance()
        summary.update(train_loss=loss, steps=step + 1)

        completed = step + 1
        if completed == config.max_steps or (config.checkpoint_every and completed % config.checkpoint_every == 0):
            summary["checkpoint"] = _save(completed, config, model_config, run, ctx)

    logger.close()
    if ctx.is_master:
        write_json(out_dir / "summary.json", summary)
    return summary


def _step_line(record: dict[str, Any], max_steps: int) -> str:
    """The console line of a train record; steps are shown 1-based, as llm.c prints them."""
    line = (f"step {record['step'] + 1:5d}/{max_steps} | loss {record['loss']:.6f} | lr {record['lr']:.2e} | "
            f"norm {record['norm']:.4f} | {record['ms']:.1f} ms | {record['tok_s']:,.0f} tok/s")
    if record["mfu"] is not None:
        line += f" | MFU {100 * record['mfu']:.1f}%"
    if "peak_mem_gb" in record:
        line += f" | {record['peak_mem_gb']:.1f} GiB"
    return line


def _evaluate_if_due(
    step: int, last_step: bool, config: TrainConfig, run: _Run, ctx: DistContext, logger: MetricsLogger
) -> dict[str, Any]:
    """Val loss, HellaSwag and a text sample at `step` when their cadence (or the end of the run) says so."""

    def due(every: int) -> bool:
        return bool(every) and (step % every == 0 or last_step)

    results: dict[str, Any] = {}
    if run.val_loader is not None and due(config.val_every):
        # the compiled (not DDP-wrapped) model: same shapes as training, no gradient sync needed
        eval_model = run.model.module if isinstance(run.model, DDP) else run.model
        loss = evaluate.val_loss(eval_model, run.val_loader, config.val_steps, ctx, config.dtype)
        logger.log({"step": step, "kind": "val", "val_loss": loss}, "val", f"step {step:5d} | val loss {loss:.6f}")
        results["val_loss"] = loss
    if config.hellaswag and due(config.hellaswag_every):
        # the uncompiled model: every example has its own length, which would recompile a compiled one
        scores = evaluate.hellaswag(run.raw_model, config.hellaswag, ctx, config.dtype)
        logger.log({"step": step, "kind": "hellaswag", **scores}, "hellaswag",
                   f"step {step:5d} | HellaSwag acc_norm {scores['acc_norm']:.4f} (acc {scores['acc']:.4f}, "
                   f"n {scores['n']})")
        results["hellaswag"] = scores
    if ctx.is_master and due(config.sample_every):
        text = sample_text(run.raw_model, config.sample_prompt, config.sample_tokens, seed=config.seed,
                           dtype=config.dtype)[0]
        logger.text("sample", f"step {step:5d} | sample: {text!r}", step)
    return results


def _save(step: int, config: TrainConfig, model_config: GPTConfig, run: _Run, ctx: DistContext) -> str:
    """Checkpoint after `step` optimizer steps; every rank contributes its loader and RNG state."""
    loader_states = gather_objects(run.train_loader.state_dict(), ctx)  # collective: every rank calls it
    rng_states = gather_objects(ckpt.capture_rng_state(), ctx)
    optimizer_state = full_state_dict(run.optimizer)  # collective under ZeRO-1
    path = ckpt.checkpoint_path(config.out_dir, step)
    if ctx.is_master:
        state = {"step": step, "model": run.raw_model.state_dict(), "optimizer": optimizer_state,
                 "guard": run.guard.state_dict(), "loader": loader_states, "rng": rng_states,
                 "world_size": ctx.world_size, "config": config.to_dict(), "model_config": asdict(model_config)}
        ckpt.save_checkpoint(config.out_dir, step, state, run.raw_model, config.model_file_dtype, config.keep_last)
    return str(path)


def main(argv: list[str] | None = None) -> None:
    try:
        config = load_config(argv)
        validate(config, world_size=int(os.environ.get("WORLD_SIZE", "1")))  # fail before any set-up
    except ConfigError as e:
        sys.exit(f"error: {e}")
    ctx = setup(config.device)
    try:
        train(config, ctx)
    finally:
        teardown()


if __name__ == "__main__":
    main()
