"""AdamW with llm.c's parameter groups and master weights, and the learning-rate schedules (pure functions of
the step)."""

from __future__ import annotations

import math
import sys

import numpy as np
import torch
import torch.nn as nn

from gpt2_kernels.stochastic_round import RoundInto, stochastic_round


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
    them to the other ranks in one message: the parameters each rank updates are views into one
    buffer of its (`parameters_as_bucket_view`). One broadcast per tensor (584 a step at d48) made a
    step on two H200s 7 ms (d48) and 9 ms (d24) longer: 0.963 and 0.941 of two GPUs' worth, against
    0.969 at both now (docs/benchmarks.md). Gradients are still all-reduced whole, so clipping is
    unchanged. The update is the same arithmetic per parameter as unsharded AdamW.

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

        return ZeroRedundancyOptimizer(groups, optimizer_class=adamw, parameters_as_bucket_view=True, **kwargs)
    return adamw(groups, **kwargs)


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW on float32 master weights; the parameters the forward pass reads hold them stochastically rounded
    to bfloat16 (still float32 tensors, so every cast to bfloat16 is exact): llm.c's `-w 1`.

    Why: during warmup an update (~lr/100 = 6e-6) is far below a bfloat16 ulp of a weight (~1.2e-4 at 0.02),
    so round-to-nearest would hide it from the bfloat16 forward for many steps; stochastic rounding passes
    it on in expectation, as llm.c does.

    The masters are views into one flat float32 buffer, made from the parameters at the first step (llm.c
    copies them too) or from the masters of a loaded state, and are `state[p]["master"]`, so they are in
    `state_dict` and checkpoints (whose state is torch's fused AdamW's: step, exp_avg, exp_avg_sq). A step is
    torch's fused AdamW kernel applied to the masters directly, then the buffer rounded (gpt2_kernels/stochastic_round.py)
    into the parameters, which are written in place, never rebound, so captured graphs keep their addresses: on
    CUDA one launch writes every parameter straight from the buffer; on the CPU pieces of the buffer are rounded
    and copied. Little Python runs per step: on a GPU the update is a few
    milliseconds, which a per-parameter loop over d12's 150 tensors would exceed. Element i of the buffer
    rounds at step s with the random bits of (hash of rounding_seed and s, i), the same on every rank, so
    data-parallel replicas stay equal; under ZeRO-1 each rank rounds the parameters it owns and broadcasts them.
    """

    ROUNDING_PIECE = 2**26  # CPU: elements rounded at once (256 MB of float32); larger parameters alone

    def __init__(self, params, rounding_seed: int = 0, **adamw_kwargs):
        if adamw_kwargs.get("amsgrad") or adamw_kwargs.get("maximize"):
            raise ValueError("MasterWeightAdamW runs plain AdamW: amsgrad and maximize are not supported")
        # step() calls the fused kernel on every device (CPU included), so the state is kept as fused AdamW keeps
        # it: a loaded step count goes to its parameter's device
        super().__init__(params, **{**adamw_kwargs, "fused": True})
        for group in self.param_groups:  # in the groups, so state_dict carries them and ZeRO-1 syncs them
            group.setdefault("rounding_seed", rounding_seed)
            group.setdefault("rounding_step", 0)
        self._flat_masters: torch.Tensor | None = None  # every parameter's master, in param_groups order
        self._views: dict[torch.Tensor, torch.Tensor] = {}  # a parameter's master, a view into _flat_masters
        self._offsets: dict[torch.Tensor, int] = {}  # a parameter's first element in _flat_masters
        self._rows: dict[torch.Tensor, torch.Tensor] = {}  # a parameter as one row, the rounding's destination
        self._plan: RoundInto | None = None  # on CUDA: where the rounding writes each parameter

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("MasterWeightAdamW.step takes no closure")
        masters = self._masters()
        updated = []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._state(p, masters[p]) for p in params]
            steps = [state["step"] for state in states]
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            torch._fused_adamw_([masters[p] for p in params], [p.grad for p in params],
                                [state["exp_avg"] for state in states], [state["exp_avg_sq"] for state in states],
                                [], steps, lr=group["lr"], beta1=beta1, beta2=beta2,
                                weight_decay=group["weight_decay"], eps=group["eps"], amsgrad=False, maximize=False)
            updated += params
        self._round_params(updated)

    def _state(self, p: torch.Tensor, master: torch.Tensor) -> dict:
        """p's AdamW state as torch's fused AdamW keeps it (made at its first update), with its master."""
        state = self.state[p]
        if "step" not in state:
            state.update(step=torch.zeros((), dtype=torch.float32, device=p.device),
                         exp_avg=torch.zeros_like(master), exp_avg_sq=torch.zeros_like(master))
        state["master"] = master
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._views = {}  # the loaded masters are separate tensors: _masters gathers them

    def _masters(self) -> dict[torch.Tensor, torch.Tensor]:
        """Each parameter's master, a view into _flat_masters; (re)made when there are none yet, or a parameter's
        state holds a master that is not its view (a state loaded, also by ZeRO-1 writing `state` directly)."""
        params = [p for group in self.param_groups for p in group["params"]]
        if len(self._views) == len(params) and all(
                self.state[p].get("master", view) is view for p, view in self._views.items()):
            return self._views
        self._flat_masters = torch.cat([self.state[p].get("master", p).detach().reshape(-1) for p in params])
        self._offsets = dict(zip(params, np.cumsum([0] + [p.numel() for p in params[:-1]]).tolist()))
        self._views = {p: self._flat_masters[self._offsets[p]:self._offsets[p] + p.numel()].view_as(p)
                       for p in params}
        self._rows = {p: p.detach().view(-1) for p in params}
        for p, view in self._views.items():
            if "master" in self.state[p]:
                self.state[p]["master"] = view
        return self._views

    def _round_params(self, params: list[torch.Tensor]) -> None:
        group = self.param_groups[0]
        step = group["rounding_step"]
        for g in self.param_groups:
            g["rounding_step"] = step + 1
        # hashed to 32 bits (the kernel's Philox key)
        seed = int(np.random.SeedSequence([group["rounding_seed"], step]).generate_state(1)[0])
        if self._flat_masters.is_cuda:  # straight into the parameters, one launch, no rounded copy in between
            self._rounding_plan(params)(seed)
            return
        # in pieces of whole parameters, each rounded at its offset (the same bits as one launch): the rounded copy
        # is one piece, not the whole buffer (at 1.5B parameters that was 6.2 GB held on top of the state)
        for start, run in _contiguous_runs(params, self._offsets, self.ROUNDING_PIECE):
            rows = [self._rows[p] for p in run]
            sizes = [row.numel() for row in rows]
            rounded = stochastic_round(self._flat_masters[start:start + sum(sizes)], seed, start)
            torch._foreach_copy_(rows, rounded.split(sizes))
            del rounded  # freed before the next piece is made: the allocator then keeps one piece cached, not two

    def _rounding_plan(self, params: list[torch.Tensor]) -> RoundInto:
        """The CUDA rounding's table for these parameters (made again when the set of parameters with a gradient,
        their places or the masters' buffer change)."""
        rows, starts = [self._rows[p] for p in params], [self._offsets[p] for p in params]
        if self._plan is None or not self._plan.matches(self._flat_masters, rows, starts):
            self._plan = None  # the old table freed before the new one is made
            self._plan = RoundInto(self._flat_masters, rows, starts)
        return self._plan

    @torch.no_grad()
    def allocate_state(self) -> None:
        """Makes the masters and AdamW's moments now, as the first step would (the same values), so that they are
        allocated before a CUDA graph's memory pool is: PyTorch's allocated-bytes peak then counts them together
        with the graph's activations, which the device holds at the same time."""
        masters = self._masters()
        for group in self.param_groups:
            for p in group["params"]:
                self._state(p, masters[p])
        if self._flat_masters.is_cuda:  # the rounding's table too, for the parameters a step updates
            self._rounding_plan([p for group in self.param_groups for p in group["params"] if p.requires_grad])


def _contiguous_runs(params: list[torch.Tensor], offsets: dict[torch.Tensor, int],
                     max_elements: int) -> list[tuple[int, list]]:
    """`params` (in offset order) as (first offset, parameters) runs that lie back to back in the flat buffer, each
    of at most `max_elements` elements unless one parameter alone has more: one run a piece when every parameter
    has a gradient."""
    runs: list[tuple[int, list]] = []
    end = size = None
    for p in params:
        if offsets[p] != end or size + p.numel() > max_elements:
            runs.append((offsets[p], []))
            size = 0
        runs[-1][1].append(p)
        end, size = offsets[p] + p.numel(), size + p.numel()
    return runs


def full_state_dict(optimizer: torch.optim.Optimizer) -> dict | None:
    """The whole optimizer state on rank 0 (None on other ranks), for a checkpoint.

    Under ZeRO-1 every rank holds one shard, so this is a collective: call it on every rank. The
    result loads into an optimizer of the same kind and world size with `load_full_state_dict` on every
    rank (each keeps its own shard).
    """
    # a ZeRO-1 optimizer exists only where configure_optimizer imported torch.distributed.optim; elsewhere the
    # import (a quarter of a CPU-second: it compiles its functional optimizers) is not paid for the check
    zero = sys.modules.get("torch.distributed.optim")
    if zero is not None and isinstance(optimizer, zero.ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if optimizer.global_rank == 0 else None
    return optimizer.state_dict()


def load_full_state_dict(optimizer: torch.optim.Optimizer, state_dict: dict) -> None:
    """Loads `full_state_dict`'s result, on every rank (under ZeRO-1 each rank keeps its own shard).

    Each AdamW step count goes to its parameter's device: a fused AdamW kernel (MasterWeightAdamW's, or torch's
    with fused=True on CUDA) takes it there, and torch's ZeroRedundancyOptimizer loads every zero-dimensional
    tensor of the state onto the CPU (a ZeRO-1 run resumed on two H200s stopped at its first update: "state_steps
    is on cpu, different from other tensors on cuda:0")."""
    optimizer.load_state_dict(state_dict)
    local = getattr(optimizer, "optim", optimizer)  # ZeRO-1's: the optimizer of this rank's shard
    if local.defaults.get("fused"):
        for param, state in local.state.items():
            if torch.is_tensor(step := state.get("step")) and step.device != param.device:
                state["step"] = step.to(param.device)


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
