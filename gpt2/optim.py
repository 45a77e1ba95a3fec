"""AdamW with llm.c's parameter groups, and the learning-rate schedules (pure functions of the step)."""

from __future__ import annotations

import math

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
    """Learning rate of optimizer step `step` (0-based), as llm.c computes it.

    Linear warmup from max_lr/warmup to max_lr over `warmup_steps`, then towards
    min_lr = final_lr_frac * max_lr at the last step:
      cosine   - half a cosine period;
      linear   - a straight line;
      constant - stays at max_lr (min_lr unused);
      wsd      - warmup-stable-decay: max_lr until the last `decay_frac` of all steps, then linear.
    """
    min_lr = max_lr * final_lr_frac
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return max_lr
    # the decay starts right after warmup, or (wsd) at the last `decay_frac` of all steps
    decay_start = max(warmup_steps, max_steps - int(decay_frac * max_steps)) if schedule == "wsd" else warmup_steps
    if step < decay_start:
        return max_lr
    progress = (step - decay_start) / max(1, max_steps - decay_start)  # 0 -> 1 over the decay
    if schedule in ("linear", "wsd"):
        return max_lr - progress * (max_lr - min_lr)
    if schedule == "cosine":
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)
    raise ValueError(f"unknown lr schedule {schedule!r}; use cosine, linear, constant or wsd")
