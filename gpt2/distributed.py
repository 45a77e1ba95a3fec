"""Process-group and device set-up: one process per GPU under torchrun (NCCL), or CPU processes (gloo).

Without torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) everything runs as a single process
and no process group is created, so the collectives below become no-ops.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_master(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """`auto` -> this rank's GPU when CUDA is available, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but CUDA is not available; use --device cpu")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def autocast_dtype(device: torch.device, dtype: str = "auto") -> torch.dtype:
    """The forward pass's activation dtype: `auto` is bf16 on CUDA, float32 on the CPU (where bf16 is slow
    and only useful in tests)."""
    if dtype == "bfloat16" or (dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def autocast_context(device: torch.device, dtype: str = "auto",
                     cache: bool = True) -> contextlib.AbstractContextManager:
    """bf16 autocast of the forward pass when `autocast_dtype` says bf16 (parameters, gradients and
    optimizer state stay float32). cache=False: no cast cache (required while capturing a CUDA graph)."""
    if autocast_dtype(device, dtype) == torch.bfloat16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache)
    return contextlib.nullcontext()


# PyTorch's CUDA caching allocator, unless the user's environment configures it (PYTORCH_ALLOC_CONF or its
# older name PYTORCH_CUDA_ALLOC_CONF). Expandable segments grow one mapping per pool instead of caching blocks of
# the sizes first asked for, which the CUDA graph's pool and the optimizer's temporaries fragment: at d12 on an
# H100 the process peaks 316 MiB lower in nvidia-smi, at the same speed (bench/reports/2026-11-24-h100-d12-round3.md)
CUDA_ALLOCATOR_SETTINGS = "expandable_segments:True"
ALLOCATOR_ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def configure_cuda_allocator() -> None:
    """CUDA_ALLOCATOR_SETTINGS for this process and its children unless the environment names others. PyTorch
    reads them when CUDA is first initialised, so this runs before that (setup does)."""
    if not any(os.environ.get(name) for name in ALLOCATOR_ENV):
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = CUDA_ALLOCATOR_SETTINGS


def setup(device: str = "auto") -> DistContext:
    """Join the torchrun process group if launched by torchrun; NCCL on CUDA, gloo on CPU."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        configure_cuda_allocator()
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        # Before the group exists: torch.distributed.optim (ZeRO-1) imports torch.distributed.nn.functional, whose
        # functions take `group=group.WORLD` as a default argument, bound when first imported. Imported after the
        # group is created, those defaults keep it alive past destroy_process_group, so gloo's worker threads are
        # never joined; at interpreter exit one can still be releasing the last collective's tensors, which needs
        # the GIL, and it is killed inside a destructor ("terminate called without an active exception").
        # Bound to a name of its own: a plain `import torch.distributed.optim` would make `torch` local to this
        # function, unbound at `torch.cuda.set_device` above.
        import torch.distributed.optim as _zero1_before_the_group  # noqa: F401

        if dev.type == "cuda":
            dist.init_process_group(backend="nccl", device_id=dev)
        else:
            dist.init_process_group(backend="gloo")
    return DistContext(rank=rank, local_rank=local_rank, world_size=world_size, device=dev)


def teardown(clean: bool = True) -> None:
    """Destroy the process group. On a clean exit every rank first waits for the others: a rank that
    destroyed its group while a peer was still in a collective aborts that peer (seen with gloo). After an
    error there is no barrier, since a peer may be gone and the barrier would hang.

    Whatever holds the group (a DDP model's reducer) must be gone before this runs: the last reference then
    drops here, without the GIL. A reducer freed after it destroys the group while holding the GIL, joining gloo's
    worker threads, one of which may be waiting for the GIL to free the barrier's work: a hang at exit, seen
    once in 16 two-rank runs. gpt2.train builds its model inside train(), which returns first."""
    if dist.is_initialized():
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def all_reduce_mean(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Mean of `t` over ranks, in place (identity in a single process)."""
    if ctx.is_distributed:
        all_reduce_sum(t, ctx).div_(ctx.world_size)
    return t


def all_reduce_sum(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum of `t` over ranks, in place (identity in a single process)."""
    if ctx.is_distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_tensors(tensors: Iterable[torch.Tensor], ctx: DistContext) -> None:
    """Rank 0's values of `tensors` on every rank, in place (nothing in a single process)."""
    if ctx.is_distributed:
        for t in tensors:
            dist.broadcast(t, src=0)


def broadcast_object(obj: Any, ctx: DistContext) -> Any:
    """Rank 0's `obj` on every rank (`obj` itself in a single process)."""
    if not ctx.is_distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank (a list of one in a single process)."""
    if not ctx.is_distributed:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out
