"""The training step, in one place: micro-batch forward/backward, gradient clipping, the update.

`gpt2.train`, the throughput benchmark (bench/bench_train.py) and the numerics check
(bench/numerics.py) all call these functions, so what is timed and checked is what trains.

    loss = forward_backward(model, batches, grad_accum, device, "bfloat16")  # device tensor, no host sync
    norm = clip_gradients(model.parameters(), max_norm=1.0)
    optimizer_step(optimizer, lr)
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Iterable

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt2.distributed import autocast_context


def forward_backward(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    grad_accum: int,
    device: torch.device,
    dtype: str,
) -> torch.Tensor:
    """Forward and backward over `grad_accum` (inputs, targets) micro-batches of `batches`.

    Returns the loss averaged over the micro-batches as a device tensor (reading it is the caller's
    host sync). Gradients are summed into .grad (fp32: the parameters are) as the mean over all
    micro-batches; a DDP-wrapped model all-reduces them in the last micro-batch's backward only.
    """
    model.train()
    loss_accum = torch.zeros((), device=device)
    micro_steps = 0
    # zip pulls from range first: a loader-backed iterator is never read past grad_accum batches
    for micro_step, (x, y) in zip(range(grad_accum), batches):
        last = micro_step == grad_accum - 1
        # DDP all-reduces gradients in backward; only the last micro-step's backward needs to
        sync = model.no_sync() if isinstance(model, DDP) and not last else nullcontext()
        with sync:
            with autocast_context(device, dtype):
                _, loss = model(x, y, return_logits=False)
            loss = loss / grad_accum  # the sum over micro-steps is the mean over the whole batch
            loss_accum += loss.detach().float()
            loss.backward()
        micro_steps += 1
    if micro_steps != grad_accum:
        raise ValueError(f"forward_backward got {micro_steps} micro-batches, expected grad_accum={grad_accum}")
    return loss_accum


def clip_gradients(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scales gradients to a global L2 norm of at most `max_norm` (0 or less: no clipping); returns the
    norm before clipping, as a device tensor. The parameters of a compiled or DDP-wrapped model are the
    plain module's, so clipping them clips the gradients the optimizer reads."""
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm if max_norm > 0 else math.inf)


def optimizer_step(optimizer: torch.optim.Optimizer, lr: float, skip: bool = False) -> None:
    """Applies the gradients at learning rate `lr` (unless `skip`), then drops them for the next step."""
    if not skip:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
