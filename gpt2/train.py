"""GPT-2 pretraining (llm.c recipe): one process, or one process per GPU under torchrun.

    python -m gpt2.train --config run.yaml --max-steps 100
    torchrun --standalone --nproc_per_node=8 -m gpt2.train --train-data 'shards/*_train_*.bin' ...

Each optimizer step accumulates `total_batch_size / (B * T * world_size)` micro-batches; gradients are
averaged over the ranks once per step (by the CUDA graph's FlatGradients, or by DDP on the last micro-batch
without graphs). The run directory (`--out-dir`, laid out by gpt2.run_dir) is locked for
the session; a run restarted in the same directory resumes from its newest checkpoint that verifies and
continues bit-exactly. A new run starts from `--init-from`'s weights when given. See docs/training.md.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common.cli import run_cli
from common.files import write_json
from data.loader import DistributedDataLoader
from gpt2 import checkpoint as ckpt
from gpt2 import evaluate
from gpt2 import step as step_fns
from gpt2.config import GPTConfig
from gpt2.distributed import (
    DistContext, all_reduce_mean, autocast_dtype, broadcast_object, broadcast_tensors, gather_objects, setup,
    teardown,
)
from gpt2.guard import OutlierGuard
from gpt2.metrics import MetricsLogger, flops_per_token, peak_flops
from gpt2.model import GPT
from gpt2.optim import configure_optimizer, full_state_dict, load_full_state_dict, lr_at
from common.paths import PathOutsideRoot
from gpt2.run_dir import RunDir, RunDirLocked
from gpt2.sample import sample_text
from gpt2.train_config import ConfigError, TrainConfig, load_config, validate
from gpt2.weights import load_model

def _resolve_flags(config: TrainConfig, ctx: DistContext) -> tuple[bool, bool, bool]:
    """(compile, kernels, cuda_graphs): explicit values win; otherwise compile and kernels are on for CUDA
    and off for the CPU, and CUDA graphs are on wherever compile is on CUDA, one process or several."""
    on_cuda = ctx.device.type == "cuda"
    use_compile = on_cuda if config.compile is None else config.compile
    use_kernels = on_cuda if config.kernels is None else config.kernels
    use_graphs = config.cuda_graphs
    if use_graphs is None:
        use_graphs = use_compile and on_cuda
    if use_graphs and not on_cuda:
        raise ConfigError(f"cuda_graphs needs a CUDA device, this run is on {ctx.device}; drop --cuda-graphs")
    return use_compile, use_kernels, use_graphs


def _use_master_weights(config: TrainConfig, device: torch.device) -> bool:
    """Explicit value, otherwise on exactly when the forward pass computes in bfloat16 (as llm.c's bf16 build)."""
    if config.master_weights is not None:
        return config.master_weights
    return autocast_dtype(device, config.dtype) == torch.bfloat16


@dataclass
class _Start:
    """Where a training session starts: a checkpoint of this run (resume), else `init_from`'s weights, else
    llm.c's init from the seed."""

    state: dict[str, Any] | None = None  # the checkpoint's full state when resuming
    weights: GPT | None = None  # init_from's model
    resumed_from: str | None = None
    rejected: list[ckpt.RejectedCheckpoint] = field(default_factory=list)  # checkpoints that failed verification


def _resume_point(run_dir: RunDir, config: TrainConfig, ctx: DistContext) -> tuple[str | None, list]:
    """Rank 0 picks the newest checkpoint that verifies and sets the newer, failed ones aside (they are never
    resumed from, and their steps are written anew); every rank gets its choice."""
    choice: tuple[str | None, list] = (None, [])
    if ctx.is_master and config.resume:
        path, rejected = ckpt.newest_valid_checkpoint(run_dir.root)
        for r in rejected:
            aside = ckpt.set_aside(r)
            print(f"warning: checkpoint {r.path} failed verification ({r.problem}); set aside as {aside.name}, "
                  f"not resumed from", file=sys.stderr, flush=True)
        if rejected:
            fallback = f"resuming from {path}" if path else "no checkpoint verifies: starting from the beginning"
            print(f"warning: {fallback}", file=sys.stderr, flush=True)
        choice = (str(path) if path else None, rejected)
    return broadcast_object(choice, ctx)


def _starting_point(run_dir: RunDir, config: TrainConfig, model_config: GPTConfig, ctx: DistContext,
                    use_kernels: bool) -> _Start:
    path, rejected = _resume_point(run_dir, config, ctx)
    if path is not None:
        state = ckpt.load_checkpoint(path, hashes=False)  # rank 0 has just hashed it
        source, held = path, ckpt.model_config_of(state)
        start = _Start(state=state, resumed_from=path, rejected=rejected)
    elif config.init_from:
        weights, _ = load_model(config.init_from, use_kernels=use_kernels)
        source, held = config.init_from, weights.config
        start = _Start(weights=weights, rejected=rejected)
    else:
        return _Start(rejected=rejected)
    if held != model_config:
        raise ValueError(
            f"{source}: holds model {held}, but the config asks for {model_config} (--model {config.model}); "
            "use another --out-dir or --init-from, or the matching --model"
        )
    return start


def forward_backward(
    model: nn.Module, loader: Any, grad_accum: int, config: TrainConfig, ctx: DistContext,
    graph: step_fns.MicroStepGraph | None = None,
) -> tuple[float, float]:
    """Forward/backward over `grad_accum` micro-batches; returns (loss averaged over ranks, grad norm).

    The step itself is gpt2/step.py's (the benchmark and the numerics check call the same). Gradients
    are left in place, clipped: the caller decides whether to apply them.
    """
    batches = ((x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True))
               for x, y in (loader.next_batch() for _ in range(grad_accum)))
    loss = step_fns.forward_backward(model, batches, grad_accum, ctx.device, config.dtype, graph)
    all_reduce_mean(loss, ctx)
    norm = step_fns.clip_gradients(model.parameters(), config.grad_clip)
    return loss.item(), norm.item()


@dataclass
class _Run:
    """What a training run is made of once built (or restored from a checkpoint)."""

    raw_model: GPT  # the plain module: state dicts, evaluation with varying shapes, sampling
    model: nn.Module  # what the training step calls: possibly compiled, and DDP-wrapped without CUDA graphs
    optimizer: torch.optim.Optimizer
    guard: OutlierGuard
    train_loader: Any
    val_loader: Any | None
    start_step: int


def _build_run(config: TrainConfig, model_config: GPTConfig, ctx: DistContext, use_compile: bool,
               use_kernels: bool, use_graphs: bool, master_weights: bool, start: _Start) -> _Run:
    """Model, optimizer, guard and loaders: fresh, from `init_from`'s weights, or from a checkpoint. Several
    ranks: DDP averages the gradients, unless CUDA graphs replay the micro-steps (MicroStepGraph does it)."""
    state = start.state
    if state is not None:
        raw_model = ckpt.model_from_state(state, ctx.device, use_kernels=use_kernels)
    elif start.weights is not None:
        raw_model = start.weights.to(ctx.device)
    else:
        raw_model = GPT.create(model_config, seed=config.seed, device=ctx.device, use_kernels=use_kernels)
    if use_graphs:  # no DDP to start every rank from rank 0's weights (and the masters made from them)
        broadcast_tensors(raw_model.state_dict().values(), ctx)
    optimizer = configure_optimizer(raw_model, config.lr, config.weight_decay, (config.beta1, config.beta2),
                                    config.eps, fused=ctx.device.type == "cuda",
                                    zero1=config.zero1 and ctx.is_distributed,
                                    master_weights=master_weights, seed=config.seed)
    guard = OutlierGuard(config.guard_window, config.skip_loss_z, config.skip_norm_z, config.max_bad_steps)
    B, T, rank, world = config.batch_size, config.seq_len, ctx.rank, ctx.world_size
    train_loader = DistributedDataLoader(config.train_data, B, T, rank, world, order=config.train_order,
                                         seed=config.seed)
    val_loader = (DistributedDataLoader(config.val_data, B, T, rank, world, order="file", split="val")
                  if config.val_every else None)

    if state is not None and "optimizer" in state:  # step 0 holds only the model
        if state["world_size"] != world:
            raise ValueError(
                f"checkpoint step {state['step']} in {config.out_dir} was written by {state['world_size']} ranks, "
                f"this run has {world}; data-loader positions are per rank, so resume with the same world size"
            )
        load_full_state_dict(optimizer, state["optimizer"])
        guard.load_state_dict(state["guard"])
        train_loader.load_state_dict(state["loader"][rank])
        ckpt.restore_rng_state(state["rng"][rank])

    model: nn.Module = torch.compile(raw_model) if use_compile else raw_model
    if ctx.is_distributed and not use_graphs:
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
    from gpt2_kernels import configure_kernels

    # before the model is built and compiled: compiled graphs bake the backend in (gpt2_kernels/attention.py)
    act_dtype = autocast_dtype(ctx.device, config.dtype)
    return configure_kernels(model_config.n_head, model_config.head_size, dtype=act_dtype, device=ctx.device,
                             keep_mlp_post_bytes=config.keep_mlp_post_gb * 1e9)


@contextmanager
def _writer_lock(run_dir: RunDir, ctx: DistContext) -> Iterator[None]:
    """Rank 0 holds the run directory's lock for the whole session; when another process holds it, or a link
    in the run directory leads out of it, every rank fails with an error naming that process or link."""
    with ExitStack() as stack:
        error = None
        if ctx.is_master:
            try:
                stack.enter_context(run_dir.lock())
            except (RunDirLocked, PathOutsideRoot) as e:
                error = (type(e).__name__, str(e))
        if error := broadcast_object(error, ctx):
            kind, message = error
            raise (RunDirLocked if kind == RunDirLocked.__name__ else PathOutsideRoot)(message)
        yield


def train(config: TrainConfig, ctx: DistContext | None = None) -> dict[str, Any]:
    """Run (or resume) training as configured; returns the run summary (also written to summary.json)."""
    ctx = ctx or setup(config.device)
    model_config = validate(config, ctx.world_size)
    run_dir = RunDir(config.out_dir)
    with _writer_lock(run_dir, ctx):
        return _train(config, model_config, run_dir, ctx)


def _initial_summary(run_dir: RunDir, config: TrainConfig, start: _Start, start_step: int,
                     earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary as of the start of this session: what earlier sessions reached (from the checkpoint
    resumed and their metrics records), so a rerun of a finished run keeps its figures."""
    train_losses = [r["loss"] for r in earlier if r.get("kind") == "train"]
    return {"out_dir": str(run_dir.root), "start_step": start_step, "steps": start_step,
            "train_loss": train_losses[-1] if train_losses else None, "checkpoint": start.resumed_from,
            "resumed_from": start.resumed_from, "init_from": None if start.state else config.init_from,
            "rejected_checkpoints": [asdict(r) for r in start.rejected]}


def _train(config: TrainConfig, model_config: GPTConfig, run_dir: RunDir, ctx: DistContext) -> dict[str, Any]:
    grad_accum = config.grad_accum_steps(ctx.world_size)
    use_compile, use_kernels, use_graphs = _resolve_flags(config, ctx)
    master_weights = _use_master_weights(config, ctx.device)
    torch.manual_seed(config.seed)
    sdpa_backend = _configure_cuda(config, model_config, ctx, use_kernels)
    start = _starting_point(run_dir, config, model_config, ctx, use_kernels)
    run = _build_run(config, model_config, ctx, use_compile, use_kernels, use_graphs, master_weights, start)
    graph = step_fns.MicroStepGraph(run.model, grad_accum, ctx.device, config.dtype,
                                    before_capture=getattr(run.optimizer, "allocate_state", None)) if use_graphs else None

    num_params = run.raw_model.num_parameters()
    flops_per_step = flops_per_token(model_config, num_params, config.seq_len) * config.total_batch_size
    peak = peak_flops(ctx.device, config.peak_flops)
    if ctx.is_master:
        resolved = {"world_size": ctx.world_size, "grad_accum_steps": grad_accum, "device": str(ctx.device),
                    "compile": use_compile, "kernels": use_kernels, "cuda_graphs": use_graphs,
                    "sdpa_backend": sdpa_backend, "master_weights": master_weights,
                    "num_params": num_params, "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else None}
        write_json(run_dir.config, {**config.to_dict(), "resolved": resolved})
    logger = MetricsLogger(run_dir, ctx.is_master, run.start_step, config.max_steps)
    logger.print(f"model {config.model}: {num_params:,} params | world {ctx.world_size} x B {config.batch_size} x "
                 f"T {config.seq_len} x grad_accum {grad_accum} = {config.total_batch_size:,} tokens/step | "
                 f"device {ctx.device} | compile {use_compile} | CUDA graphs {use_graphs} | "
                 f"start step {run.start_step}/{config.max_steps}")

    summary = _initial_summary(run_dir, config, start, run.start_step, logger.kept)
    for step in range(run.start_step, config.max_steps + 1):
        last_step = step == config.max_steps
        summary.update(_evaluate_if_due(step, last_step, config, run, ctx, logger))
        if last_step:
            break

        t0 = time.perf_counter()
        lr = lr_at(step, config.lr, config.max_steps, config.warmup_steps, config.lr_schedule,
                   config.final_lr_frac, config.decay_frac)
        loss, norm = forward_backward(run.model, run.train_loader, grad_accum, config, ctx, graph)
        decision = run.guard.check(loss, norm)  # same inputs on every rank -> same decision on every rank
        if decision.skip:
            logger.print(f"step {step}: update skipped: {decision.reason}")
        step_fns.optimizer_step(run.optimizer, lr, skip=decision.skip)
        # No device sync here: the update runs on the GPU while the host logs and queues the next step's
        # batches and micro-steps. Each step waits once, for its own loss and norm, so in a steady run dt is
        # still the step's real period (this step's forward/backward and the previous step's update).
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
            summary["checkpoint"] = _save(completed, run_dir, config, model_config, run, ctx)

    logger.close()
    if ctx.is_master:
        write_json(run_dir.summary, summary)
    return summary


def _step_line(record: dict[str, Any], max_steps: int) -> str:
    """The console line of a train record, at the record's step (docs/training.md, "Steps")."""
    line = (f"step {record['step']:5d}/{max_steps} | loss {record['loss']:.6f} | lr {record['lr']:.2e} | "
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


def _save(step: int, run_dir: RunDir, config: TrainConfig, model_config: GPTConfig, run: _Run,
          ctx: DistContext) -> str:
    """Checkpoint after `step` optimizer steps; every rank contributes its loader and RNG state."""
    loader_states = gather_objects(run.train_loader.state_dict(), ctx)  # collective: every rank calls it
    rng_states = gather_objects(ckpt.capture_rng_state(), ctx)
    optimizer_state = full_state_dict(run.optimizer)  # collective under ZeRO-1
    path = run_dir.checkpoint(step)
    if ctx.is_master:
        state = {"step": step, "model": run.raw_model.state_dict(), "optimizer": optimizer_state,
                 "guard": run.guard.state_dict(), "loader": loader_states, "rng": rng_states,
                 "world_size": ctx.world_size, "config": config.to_dict(), "model_config": asdict(model_config)}
        ckpt.save_checkpoint(run_dir.root, step, state, run.raw_model, config.model_file_dtype, config.keep_last)
    return str(path)


def main(argv: list[str] | None = None) -> None:
    try:
        config = load_config(argv)
        validate(config, world_size=int(os.environ.get("WORLD_SIZE", "1")))  # fail before any set-up
    except ConfigError as e:
        sys.exit(f"error: {e}")
    ctx = setup(config.device)
    clean = False
    try:
        train(config, ctx)
        clean = True
    finally:
        teardown(clean)


if __name__ == "__main__":
    run_cli(main)
