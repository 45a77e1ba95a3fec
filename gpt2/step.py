"""The training step, in one place: micro-batch forward/backward, gradient clipping, the update.

`gpt2.train`, the throughput benchmark (bench/bench_train.py) and the numerics check
(bench/numerics.py) all call these functions, so what is timed and checked is what trains.

    loss = forward_backward(model, batches, grad_accum, device, "bfloat16")  # device tensor, no host sync
    norm = clip_gradients(model.parameters(), max_norm=1.0)
    optimizer_step(optimizer, lr)

On CUDA, `MicroStepGraph(model, grad_accum, device, dtype)` passed as forward_backward's `graph` replays
each micro-step as a CUDA graph once it has warmed up; under torchrun it also averages the gradients over
the ranks (the model is then not DDP-wrapped).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt2.distributed import autocast_context, autocast_dtype


def forward_backward(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    grad_accum: int,
    device: torch.device,
    dtype: str,
    graph: MicroStepGraph | None = None,
) -> torch.Tensor:
    """Forward and backward over `grad_accum` (inputs, targets) micro-batches of `batches`.

    Returns the loss averaged over the micro-batches as a device tensor (reading it is the caller's
    host sync). Gradients are summed into .grad (fp32: the parameters are) as the mean over all
    micro-batches; a DDP-wrapped model all-reduces them in the last micro-batch's backward only.
    With `graph` (built for this model and grad_accum), each micro-step runs through it and the graph
    averages the gradients over the ranks once all have run.
    """
    model.train()
    loss_accum = torch.zeros((), device=device)
    micro_steps = 0
    # zip pulls from range first: a loader-backed iterator is never read past grad_accum batches
    for micro_step, (x, y) in zip(range(grad_accum), batches):
        if graph is not None:
            loss_accum += graph(x, y, first=micro_step == 0)
        else:
            last = micro_step == grad_accum - 1
            # DDP all-reduces gradients in backward; only the last micro-step's backward needs to
            with model.no_sync() if isinstance(model, DDP) and not last else nullcontext():
                loss_accum += _micro_step(model, x, y, grad_accum, device, dtype)
        micro_steps += 1
    if micro_steps != grad_accum:
        raise ValueError(f"forward_backward got {micro_steps} micro-batches, expected grad_accum={grad_accum}")
    if graph is not None:
        graph.gradients.average_over_ranks()
    return loss_accum


def _micro_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, grad_accum: int, device: torch.device,
                dtype: str, autocast_cache: bool = True, gradients: FlatGradients | None = None,
                casts: CastWeights | None = None) -> torch.Tensor:
    """One micro-batch's forward and backward; returns its loss / grad_accum, detached, in fp32. The gradients
    are added to the parameters' .grad: by autograd, or with `gradients` by the weight-gradient GEMMs of the
    model's projections and for the rest in one multi-tensor add. With `casts`, the forward reads the weights'
    casts from there."""
    kwargs = {"cast_weights": casts.copies} if casts is not None else {}
    if gradients is not None:
        kwargs["weight_grads"] = gradients.gemm_views
    with autocast_context(device, dtype, cache=autocast_cache):
        _, loss = model(x, y, return_logits=False, **kwargs)
    loss = loss / grad_accum  # the sum over micro-steps is the mean over the whole batch
    if gradients is None:
        loss.backward()
    else:
        gradients.accumulate(torch.autograd.grad(loss, gradients.autograd_params, allow_unused=True,
                                                 materialize_grads=True))
    return loss.detach().float()


class FlatGradients:
    """Every trainable parameter's .grad as a view into one flat buffer, handed back to the parameters (zeroed)
    at each step's first micro-step: backward then adds into fixed addresses, which a CUDA graph replays, and
    averaging over ranks is one all-reduce of the buffer, as DDP's gradient_as_bucket_view with a single
    bucket (DDP's own all-reduce runs from autograd hooks, which a replayed graph does not call).

    The gradients of `in_gemm` (`GPT.projections()`) are added into their views by their weight-gradient GEMMs
    (`gemm_views`, the model's weight_grads: cuBLAS's beta = 1, as llm.c accumulates), the others' by `accumulate`:
    the same sums, bit for bit on CUDA, with 39% of d48's gradients no longer written, read back and added apart (its
    step 14 ms shorter on an H200, docs/benchmarks.md)."""

    def __init__(self, params: Iterable[torch.Tensor], in_gemm: Iterable[torch.Tensor] = ()):
        self.params = [p for p in params if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"FlatGradients needs parameters of one dtype, got {sorted(map(str, dtypes))}")
        self.flat = torch.zeros(sum(p.numel() for p in self.params), dtype=dtypes.pop(), device=self.params[0].device)
        self.views, offset = [], 0
        for p in self.params:
            self.views.append(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        view_of = {id(p): view for p, view in zip(self.params, self.views)}
        in_gemm = list(in_gemm)
        if missing := [tuple(p.shape) for p in in_gemm if id(p) not in view_of]:
            raise ValueError(f"FlatGradients: in_gemm parameters {missing} are none of its trainable parameters")
        self.gemm_views = [view_of[id(p)] for p in in_gemm]
        added_in_gemm = set(map(id, in_gemm))
        self.autograd_params = [p for p in self.params if id(p) not in added_in_gemm]
        self._autograd_views = [view for p, view in zip(self.params, self.views) if id(p) not in added_in_gemm]

    def attach_zeroed(self) -> None:
        """Zeroes the buffer and makes the views the parameters' gradients again (optimizer_step drops them)."""
        self.flat.zero_()
        for p, g in zip(self.params, self.views):
            p.grad = g

    def accumulate(self, grads: Iterable[torch.Tensor]) -> None:
        """Adds one micro-step's gradients (in `autograd_params` order) into the buffer: one multi-tensor add where
        autograd would launch one kernel per parameter (d12's ~150 took 0.63 ms a micro-step on an H200; the
        bytes they move take about 0.35 ms at its memory bandwidth). The sums are the same, bit for bit.
        Gradients laid out unlike their parameter (c_attn's and c_fc's dW, rows C + 8 apart as their GEMM
        writes them: gpt2_kernels.linear.weight_and_bias_grads) are added one by one: a multi-tensor add takes
        only lists whose pairs share strides, else it adds every pair on its own."""
        pairs = list(zip(self._autograd_views, grads, strict=True))
        alike = [(view, grad) for view, grad in pairs if view.stride() == grad.stride()]
        if alike:  # a multi-tensor add refuses empty lists
            torch._foreach_add_([view for view, _ in alike], [grad for _, grad in alike])
        for view, grad in pairs:
            if view.stride() != grad.stride():
                view.add_(grad)

    def average_over_ranks(self) -> None:
        """The mean over the process group's ranks, in place (nothing without a group of several): divided
        first and then summed, as DDP does."""
        if dist.is_initialized() and (world := dist.get_world_size()) > 1:
            self.flat.div_(world)
            dist.all_reduce(self.flat)


class CastWeights:
    """The model's weight matrices (`GPT.matrices`) cast to the compute dtype once per optimizer step, for every
    micro-step's forward to read (`GPT.forward`'s cast_weights) instead of casting them again: at d48 on an H200
    those casts took 23.8 ms of a 2.39 s step of 8 micro-steps, and casting once made the step 16.5 ms shorter
    (docs/benchmarks.md). The copies live at fixed addresses, which a CUDA graph replays. They take the memory
    that one micro-step's casts held from its forward to its backward (all of them at once where the forward
    ends): d48's peak in nvidia-smi came out 220 MiB lower."""

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        self.params = model.matrices()
        self.copies = [torch.empty_like(p, dtype=dtype) for p in self.params]

    @torch.no_grad()  # else each copy would hold its parameter's autograd node (breaking a CUDA graph's capture)
    def refresh(self) -> None:
        """The copies made anew from the parameters: the same values as casting them in each forward."""
        torch._foreach_copy_(self.copies, self.params)


class MicroStepGraph:
    """A micro-step's forward and backward captured once as a CUDA graph, then replayed for every
    micro-batch: one launch instead of ~800, so the GPU no longer idles while the CPU issues kernels
    (the CuTe DSL kernels of the gpu extra take tens of microseconds of Python each).

    The weight matrices are cast to the compute dtype at each step's first micro-step, into `CastWeights` that
    the micro-steps' forwards read (where the model has any: the fused path in a 16-bit dtype).

    The first `warmup` micro-steps run eagerly (torch.compile compiles, Triton's kernels build); the next
    is captured, after `before_capture` (gpt2.train: the optimizer's state, made now rather than at the first
    update, so that PyTorch's allocated-bytes peak sees it beside the graph's activations). A graph replays fixed addresses, so inputs are copied into static buffers, and gradients
    are summed into `gradients` (FlatGradients), whose views are the parameters' .grad from every step's
    first micro-step on, eager or replayed. Under torchrun the model is not DDP-wrapped: forward_backward
    averages `gradients` over the ranks after the last micro-step, in one all-reduce outside the graph.
    """

    def __init__(self, model: nn.Module, grad_accum: int, device: torch.device, dtype: str, warmup: int = 3,
                 before_capture: Callable[[], None] | None = None):
        if isinstance(model, DDP):
            raise ValueError("MicroStepGraph averages gradients over ranks itself; pass the model without DDP")
        self.model, self.grad_accum, self.device, self.dtype = model, grad_accum, device, dtype
        self.warmup = warmup
        self.before_capture = before_capture
        self.eager_steps = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.gradients = FlatGradients(model.parameters(), in_gemm=model.projections())
        compute_dtype = autocast_dtype(device, dtype)
        casts = CastWeights(model, compute_dtype) if compute_dtype != torch.float32 else None
        self.casts = casts if casts is not None and casts.params else None  # none: the plain path, autocast casts
        self.static_x = self.static_y = self.static_loss = None

    def __call__(self, x: torch.Tensor, y: torch.Tensor, first: bool) -> torch.Tensor:
        """This micro-batch's loss / grad_accum (a device tensor that the next call overwrites)."""
        if first:
            self.gradients.attach_zeroed()
            if self.casts is not None:
                self.casts.refresh()
        if self.graph is None and self.eager_steps < self.warmup:
            self.eager_steps += 1
            # contiguous like the static buffers: a compiled model guards on its inputs' strides
            return _micro_step(self.model, x.contiguous(), y.contiguous(), self.grad_accum, self.device, self.dtype,
                               autocast_cache=False, gradients=self.gradients, casts=self.casts)
        if self.graph is None:
            self._capture(x, y)
        self.static_x.copy_(x, non_blocking=True)
        self.static_y.copy_(y, non_blocking=True)
        self.graph.replay()
        return self.static_loss

    def _capture(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Records one micro-step (capturing runs nothing: the caller replays it for this batch)."""
        self.static_x = torch.empty(x.shape, dtype=x.dtype, device=self.device)  # contiguous
        self.static_y = torch.empty(y.shape, dtype=y.dtype, device=self.device)
        if self.before_capture is not None:  # e.g. the optimizer's state: allocated beside the graph's pool, not after
            self.before_capture()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # the eager micro-steps' cached blocks: the graph's pool replaces them
        self.graph = torch.cuda.CUDAGraph()
        # under torchrun, NCCL's watchdog thread queries its events meanwhile, which a capture in the default
        # (global) mode would take as an illegal call: only this thread's calls are checked then
        mode = "thread_local" if dist.is_initialized() else "global"
        # a compile inside the capture cannot run (it reads values back to the host): say so if one is due
        with torch._dynamo.config.patch(error_on_recompile=True), \
                torch.cuda.graph(self.graph, capture_error_mode=mode):
            # no autocast cast cache (it would outlive the capture's memory), as in the warm-up: a compiled
            # model guards on autocast's state
            self.static_loss = _micro_step(self.model, self.static_x, self.static_y, self.grad_accum, self.device,
                                           self.dtype, autocast_cache=False, gradients=self.gradients,
                                           casts=self.casts)


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
