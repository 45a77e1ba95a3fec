"""AdamW with llm.c's parameter groups, and the learning-rate schedules (pure functions of the step)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn


def configure_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    fused: bool = False,
    zero1: bool = False,
) -> torch.optim.Optimizer:
    """AdamW with weight decay on 2-D tensors only (wte, wpe, the four matrices per layer).

    Biases and LayerNorm parameters are not decayed. The tied lm_head is the wte tensor, and
    `named_parameters` yields a shared tensor once, so it is updated once.

    `zero1` (needs an initialised process group) shards the optimizer state (ZeRO stage 1): each rank
    keeps AdamW's two fp32 moments of about 1/world of the parameters, updates those, and broadcasts
    them to the other ranks. Gradients are still all-reduced whole by DDP, so clipping is unchanged.
    The update is the same arithmetic per parameter as unsharded AdamW.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if zero1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, lr=lr, betas=betas, eps=eps,
                                       fused=fused)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)


def full_state_dict(optimizer: torch.optim.Optimizer) -> dict | None:
    """The whole optimizer state on rank 0 (None on other ranks), for a checkpoint.

    Under ZeRO-1 every rank holds one shard, so this is a collective: call it on every rank. The
    result loads into an optimizer of the same kind and world size with `load_state_dict` on every
    rank (each keeps its own shard).
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if optimizer.global_rank == 0 else None
    return optimizer.state_dict()


def lr_at(
    step: int,
    max_lr: float,
    max_steps: int,
    warmup_steps: int,
    schedule: str = "cosine",
    final_lr_frac: float = 0.0,
    decay_frac: float = 0.2,
) -> float:
    """Learning rate of optimizer step `step` (0-based), with the formulas of llm.c's schedulers.h.

    Linear warmup from max_lr/warmup to max_lr over `warmup_steps`, then towards
    min_lr = final_lr_frac * max_lr at step `max_steps` (the last step taken, max_steps - 1, stays above it):
      cosine   - half a cosine period from the end of warmup;
      linear   - a straight line from the end of warmup;
      constant - stays at max_lr (min_lr unused). llm.c's `constant` has no warmup at all: the two agree
                 only with warmup_steps=0;
      wsd      - warmup-stable-decay: max_lr until the decay point, then 1 - sqrt of the decay progress.
                 llm.c fixes the decay to the last 20 % of steps; `decay_frac` generalises it (0.2 = llm.c).
    Values are computed in double precision; llm.c's float32 differs in the last float32 bits.
    """
    min_lr = max_lr * final_lr_frac
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return max_lr
    if schedule == "wsd":
        # llm.c: decay_point = (int)(0.8f * train_num_batches), float32 arithmetic, so the decay starts on
        # the same step; a warmup longer than that is finished first, then the decay continues from there
        decay_point = int(np.float32(1.0 - decay_frac) * np.float32(max_steps))
        if step < decay_point:
            return max_lr
        progress = (step - decay_point) / max(1, max_steps - decay_point)  # 0 -> 1 over the decay
        return min_lr + (1.0 - math.sqrt(progress)) * (max_lr - min_lr)
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)  # 0 -> 1 after warmup
    if schedule == "linear":
        return max_lr - progress * (max_lr - min_lr)
    if schedule == "cosine":
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)
    raise ValueError(f"unknown lr schedule {schedule!r}; use cosine, linear, constant or wsd")
