"""ZeRO-1 against plain DDP on this host's GPUs: tokens/s and per-GPU memory, one process per GPU.

    torchrun --standalone --nproc_per_node=2 -m bench.bench_zero1 --model d24 --batch-size 32

One model, compiled and DDP-wrapped once, trains a few optimizer steps of gpt2/step.py's step with
unsharded fused AdamW, then with ZeRO-1 (`configure_optimizer(zero1=True)`); per mode: median step
time, tokens/s over all ranks, the optimizer state each rank holds, and the largest per-rank peak of
allocated memory. Random tokens. Runs on CPU with gloo too (tiny models), for a dry run.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt2 import step as step_fns
from gpt2.config import parse_model_spec
from gpt2.distributed import DistContext, setup, teardown
from gpt2.model import GPT
from gpt2.optim import configure_optimizer


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of optimizer state (AdamW's moments) held by this rank."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer wraps the local AdamW
    return sum(t.numel() * t.element_size() for s in inner.state.values() for t in s.values()
               if torch.is_tensor(t) and t.dim() > 0)


def max_over_ranks(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return float(t.item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="d24", help="model descriptor or explicit shape (default d24)")
    parser.add_argument("--batch-size", type=int, default=32, help="micro-batch B per rank (default 32)")
    parser.add_argument("--seq-len", type=int, default=1024, help="T (default 1024)")
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step (default 1)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per mode (default 4)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--out", help="rank 0 writes the results here as JSON")
    args = parser.parse_args()
    ctx = setup("auto")
    results = measure(args, ctx)  # the DDP model (its reducer holds the process group) is gone on return
    if ctx.is_master:
        report(results, args.out)
    teardown()


def measure(args: argparse.Namespace, ctx: DistContext) -> list[dict]:
    """One row per mode (plain fused AdamW, then ZeRO-1): step time, tokens/s and memory."""
    cuda = ctx.device.type == "cuda"
    config = parse_model_spec(args.model)
    if cuda:
        from gpt2_kernels import configure_kernels

        torch.backends.cuda.matmul.allow_tf32 = True
        configure_kernels(config.n_head, config.head_size, device=ctx.device)
    raw = GPT.create(config, seed=42, device=ctx.device, use_kernels=cuda)
    model = DDP(torch.compile(raw) if cuda else raw, device_ids=[ctx.local_rank] if cuda else None)
    g = torch.Generator(device=ctx.device).manual_seed(ctx.rank)
    tokens = torch.randint(0, config.vocab_size, (args.grad_accum, args.batch_size, args.seq_len + 1),
                           device=ctx.device, generator=g)
    micro_batches = [(t[:, :-1], t[:, 1:]) for t in tokens]
    dtype = "bfloat16" if cuda else "float32"
    results = []
    for zero1 in (False, True):
        optimizer = configure_optimizer(raw, 6e-4, 0.1, fused=cuda, zero1=zero1)
        times = []
        for i in range(args.warmup + args.steps):
            if i == args.warmup and cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            step_fns.forward_backward(model, micro_batches, args.grad_accum, ctx.device, dtype)
            step_fns.clip_gradients(raw.parameters(), 1.0)
            step_fns.optimizer_step(optimizer, 6e-4)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        dt = statistics.median(times[args.warmup:])
        peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else float("nan")
        results.append({
            "mode": "zero1" if zero1 else "ddp", "model": args.model, "world": ctx.world_size,
            "B": args.batch_size, "T": args.seq_len, "grad_accum": args.grad_accum, "step_ms": dt * 1e3,
            "tokens_per_s": ctx.world_size * args.grad_accum * args.batch_size * args.seq_len / dt,
            "optimizer_state_gb_per_rank": max_over_ranks(state_bytes(optimizer), ctx.device) / 1e9,
            "peak_alloc_gb_per_rank": max_over_ranks(peak, ctx.device),
        })
        del optimizer
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return results


def report(results: list[dict], out: str | None) -> None:
    """The rows as a markdown table (docs/benchmarks.md's), and as JSON in `out` if given."""
    print("| mode | model | GPUs | B x T x accum | step ms | tokens/s | optimizer state GB/GPU | peak alloc GB/GPU |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['mode']} | {r['model']} | {r['world']} | {r['B']} x {r['T']} x {r['grad_accum']} | "
              f"{r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {r['optimizer_state_gb_per_rank']:.2f} | "
              f"{r['peak_alloc_gb_per_rank']:.1f} |", flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
