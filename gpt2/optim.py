"""AdamW with llm.c's parameter groups and master weights, and the learning-rate schedules (pure functions of
the step)."""

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
    master_weights: bool = False,
    seed: int = 0,
) -> torch.optim.Optimizer:
    """AdamW with weight decay on 2-D tensors only (wte, wpe, the four matrices per layer).

    Biases and LayerNorm parameters are not decayed. The tied lm_head is the wte tensor, and
    `named_parameters` yields a shared tensor once, so it is updated once.

    `zero1` (needs an initialised process group) shards the optimizer state (ZeRO stage 1): each rank
    keeps AdamW's two fp32 moments of about 1/world of the parameters, updates those, and broadcasts
    them to the other ranks. Gradients are still all-reduced whole by DDP, so clipping is unchanged.
    The update is the same arithmetic per parameter as unsharded AdamW.

    `master_weights` is llm.c's `-w 1`: AdamW updates float32 master copies and the parameters hold them
    stochastically rounded to bfloat16 (see `MasterWeightAdamW`), with random bits from `seed` and the step.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    adamw: type[torch.optim.AdamW] = torch.optim.AdamW
    kwargs: dict = dict(lr=lr, betas=betas, eps=eps, fused=fused)
    if master_weights:
        adamw, kwargs = MasterWeightAdamW, {**kwargs, "rounding_seed": seed}
    if zero1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(groups, optimizer_class=adamw, **kwargs)
    return adamw(groups, **kwargs)


def stochastic_round_bf16(x: torch.Tensor, random16: torch.Tensor) -> torch.Tensor:
    """float32 `x` rounded to a bfloat16 value (returned as float32), up or down at random, unbiased.

    llm.c's `stochastic_rounding`: the low 16 bits of x's float32 pattern (the part bfloat16 drops) are
    compared with `random16` (int32, uniform in [0, 65536)); x rounds away from zero, to the next bfloat16,
    when they exceed it, so with probability low/65536, and towards zero otherwise. The expectation is x.
    Adding 1 << 16 to the truncated pattern is the step to the next bfloat16, carries into the exponent
    included.
    """
    bits = x.view(torch.int32)
    round_up = (bits & 0xFFFF) > random16
    # in place on the truncated pattern: the optimizer rounds 39M-element buckets, and each int32 temporary
    # there is 155 MB more at the step's memory peak
    rounded = (bits & ~0xFFFF).add_(round_up, alpha=1 << 16)
    return rounded.view(torch.float32)


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW on float32 master weights; the parameters the forward pass reads hold them stochastically rounded
    to bfloat16 (still float32 tensors, so every cast to bfloat16 is exact): llm.c's `-w 1`.

    Why: during warmup an update (~lr/100 = 6e-6) is far below a bfloat16 ulp of a weight (~1.2e-4 at 0.02),
    so round-to-nearest would hide it from the bfloat16 forward for many steps; stochastic rounding passes
    it on in expectation, as llm.c does.

    The masters are `state[p]["master"]` (plain tensors, so they are in `state_dict` and checkpoints).
    Parameters are written in place, never rebound, so captured graphs keep their addresses. The random
    bits of step s come from a generator seeded with (rounding_seed, s), the same on every rank, so data-
    parallel replicas stay equal; under ZeRO-1 each rank rounds the parameters it owns and broadcasts them.
    """

    def __init__(self, params, rounding_seed: int = 0, **adamw_kwargs):
        super().__init__(params, **adamw_kwargs)
        for group in self.param_groups:  # in the groups, so state_dict carries them and ZeRO-1 syncs them
            group.setdefault("rounding_seed", rounding_seed)
            group.setdefault("rounding_step", 0)

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        self._load_masters(params)
        loss = super().step(closure)
        self._store_masters(params)
        self._round_params(params)
        return loss

    def _load_masters(self, params: list[torch.Tensor]) -> None:
        """AdamW updates the masters' values; a first step starts from the parameters (llm.c copies them too)."""
        with_master = [p for p in params if "master" in self.state[p]]
        if with_master:
            torch._foreach_copy_(with_master, [self.state[p]["master"] for p in with_master])

    def _store_masters(self, params: list[torch.Tensor]) -> None:
        for p in params:
            if "master" not in self.state[p]:
                self.state[p]["master"] = torch.empty_like(p)
        if params:
            torch._foreach_copy_([self.state[p]["master"] for p in params], params)

    def _round_params(self, params: list[torch.Tensor]) -> None:
        group = self.param_groups[0]
        step = group["rounding_step"]
        for g in self.param_groups:
            g["rounding_step"] = step + 1
        if not params:
            return
        generator = torch.Generator(params[0].device)
        # hashed to 32 bits: the CPU generator (mt19937) ignores a seed's higher bits
        generator.manual_seed(int(np.random.SeedSequence([group["rounding_seed"], step]).generate_state(1)[0]))
        # a few flat buckets rather than one launch sequence per tensor: per tensor, the ~150 tensors of d12
        # cost ~30 ms a step in kernel launches; a bucket bounds the temporaries to a few times ROUNDING_BUCKET
        for bucket in _buckets(params, ROUNDING_BUCKET):
            masters = torch.cat([self.state[p]["master"].reshape(-1) for p in bucket])  # (numel of the bucket,)
            random16 = torch.randint(0, 1 << 16, masters.shape, generator=generator, device=masters.device,
                                     dtype=torch.int32)
            rounded = stochastic_round_bf16(masters, random16).split([p.numel() for p in bucket])
            torch._foreach_copy_(bucket, [r.view_as(p) for r, p in zip(rounded, bucket)])


ROUNDING_BUCKET = 1 << 25  # elements rounded per launch sequence (128 MB of float32)


def _buckets(params: list[torch.Tensor], max_numel: int) -> list[list[torch.Tensor]]:
    """`params` in order, grouped into runs of at most `max_numel` elements (a larger tensor is a run alone)."""
    buckets: list[list[torch.Tensor]] = [[]]
    filled = 0
    for p in params:
        if buckets[-1] and filled + p.numel() > max_numel:
            buckets.append([])
            filled = 0
        buckets[-1].append(p)
        filled += p.numel()
    return buckets


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
