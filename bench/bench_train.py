"""Training-step benchmark: our kernels vs plain PyTorch + torch.compile, in one run, one table.

For each variant it builds the model (llm.c init), fused AdamW and torch.compile, then times full
optimizer steps after warm-up, each one gpt2/step.py's step as gpt2.train runs it (grad_accum
micro-steps of B x T random tokens under bf16 autocast, grad-norm clip, AdamW), and reports tokens/s,
MFU, peak GPU memory and step time:

  kernels               GPT(use_kernels=True): fused residual+LayerNorm, fused classifier, SDPA backend
                        checked and pinned by gpt2_kernels.configure_kernels (cuDNN first), torch.compile for the rest
  kernels-compile-ln    the same, but residual add + LayerNorm written in plain ops for Inductor to fuse
                        (is our kernel worth keeping inside the whole step?)
  kernels-triton-softmax  the same, but the classifier's Triton softmax pass where quack's scaled-exp
                        GEMMs would run (gpt2_kernels/cross_entropy_scaled_exp.py: is it worth it?)
  kernels-dw-add        kernels-triton-softmax with its dW accumulated by a separate add, as before
                        gpt2_kernels.cross_entropy.accumulate_dw (is the matmul-epilogue accumulation worth it?)
  kernels-max-autotune  the kernels path compiled with mode="max-autotune-no-cudagraphs" (Triton GEMM
                        templates with the pointwise work, GELU included, fused into their epilogues)
  kernels-chunk-32768   the kernels path with 32,768-row classifier chunks (fewer, larger matmuls; +1.6 GB)
  kernels-no-graphs     the kernels path with each micro-step launched kernel by kernel instead of replayed
                        as a CUDA graph (gpt2/step.py's MicroStepGraph)
  kernels-recompute-post  the kernels path with every MLP rebuilding its GELU output in backward instead of
                        keeping the first layers' (gpt2.train --keep-mlp-post-gb 0)
  kernels-fp8           the kernels path with the blocks' matmuls in FP8 (bench/fp8.py: torchao's float8
                        training, tensorwise scales); needs torchao
  plain                 GPT(use_kernels=False) the way build-nanogpt trains: whole model compiled, PyTorch's
                        default SDPA dispatch, fused AdamW, TF32 'high': the in-run plain-PyTorch peer
                        (bench/peer_nanogpt.py runs build-nanogpt itself)
  plain-fp8             plain with the blocks' matmuls in FP8, torchao's own recipe (module swap + compile)

Each variant also profiles one step, CUDA time grouped by kernel kind (where the time goes). Then,
unless switched off: per-kernel timings at the training shapes (bench/bench_kernels.py) and the
numerics check (bench/numerics.py). Results also go to --out as JSON, profile and log files.

    python -m bench.bench_train --help
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import datetime
import json
import platform
import signal
import subprocess
import time
import traceback
import unittest.mock
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

import gpt2.model
import gpt2_kernels.cross_entropy
from bench.fp8 import convert_blocks_to_fp8
from gpt2 import step as step_fns
from gpt2.config import GPTConfig
from gpt2.distributed import configure_cuda_allocator
from gpt2.model import GPT
from gpt2.optim import configure_optimizer
from gpt2.metrics import flops_per_token, peak_flops
from gpt2.train_config import TrainConfig
from gpt2_kernels import configure_kernels, linear_cross_entropy
from gpt2_kernels.attention import enable_all_sdpa_backends
from gpt2_kernels.layernorm import add_layernorm_reference
from gpt2_kernels.linear import with_ones_column


@dataclass(frozen=True)
class Variant:
    use_kernels: bool
    sdpa: tuple[str, ...] | None  # SDPA backend preference (gpt2_kernels.configure_kernels); None: PyTorch's default
    fa4_backward: bool = True  # False: SDPA's own backward even where flash-attn-4 is installed
    gelu_epilogue: bool = True  # False: the MLP's GELU left to Inductor even where quack-kernels is installed
    fused_layernorm: bool = True  # False: the kernels path with add+LayerNorm left to Inductor
    scaled_exp: bool = True  # False: the classifier's Triton softmax pass even where quack's SM90 GEMMs run
    dw_in_epilogue: bool = True  # False: the Triton classifier's dW accumulated by a separate add
    compile_mode: str | None = None  # torch.compile's mode
    cuda_graphs: bool = True  # False: micro-steps launched kernel by kernel (gpt2.train --no-cuda-graphs)
    chunk_rows: int | None = None  # classifier rows per chunk; None: gpt2_kernels.cross_entropy's default
    fp8: bool = False  # the blocks' matmuls in FP8 (bench/fp8.py)
    keep_mlp_post_gb: float = TrainConfig.keep_mlp_post_gb  # gpt2.train's, default included


KERNELS_SDPA = ("cudnn", "flash")
VARIANTS = {
    "kernels": Variant(use_kernels=True, sdpa=KERNELS_SDPA),
    "kernels-sdpa-bwd": Variant(use_kernels=True, sdpa=KERNELS_SDPA, fa4_backward=False),
    "kernels-inductor-gelu": Variant(use_kernels=True, sdpa=KERNELS_SDPA, gelu_epilogue=False),
    "kernels-compile-ln": Variant(use_kernels=True, sdpa=KERNELS_SDPA, fused_layernorm=False),
    "kernels-triton-softmax": Variant(use_kernels=True, sdpa=KERNELS_SDPA, scaled_exp=False),
    "kernels-dw-add": Variant(use_kernels=True, sdpa=KERNELS_SDPA, scaled_exp=False, dw_in_epilogue=False),
    "kernels-max-autotune": Variant(use_kernels=True, sdpa=KERNELS_SDPA, compile_mode="max-autotune-no-cudagraphs"),
    "kernels-no-graphs": Variant(use_kernels=True, sdpa=KERNELS_SDPA, cuda_graphs=False),
    "kernels-chunk-32768": Variant(use_kernels=True, sdpa=KERNELS_SDPA, chunk_rows=32768),
    "kernels-recompute-post": Variant(use_kernels=True, sdpa=KERNELS_SDPA, keep_mlp_post_gb=0.0),
    "kernels-fp8": Variant(use_kernels=True, sdpa=KERNELS_SDPA, fp8=True),
    "plain": Variant(use_kernels=False, sdpa=None),
    "plain-fp8": Variant(use_kernels=False, sdpa=None, fp8=True),
}


def inductor_add_layernorm(x, y, weight, bias, eps=1e-5, out_dtype=None, bias_in_y=None, ones_column=False):
    """gpt2_kernels.add_layernorm's signature over its plain formula, which torch.compile then fuses itself."""
    residual, out = add_layernorm_reference(x, y, weight, bias, eps, bias_in_y)
    out = out.to(out_dtype or x.dtype)
    return residual, with_ones_column(out) if ones_column else out


def separate_add_dw(dw, dlogits, xc):
    """The classifier's dW accumulation as it was before the matmul epilogue took it: a bf16 product,
    then a separate mixed-dtype add into the fp32 accumulator."""
    dw += dlogits.t() @ xc
    return dw


@dataclass
class StepResult:
    variant: str
    model: str
    B: int
    T: int
    grad_accum: int
    step_ms: float
    tokens_per_s: float
    mfu: float
    peak_mem_gb: float  # max allocated by tensors
    peak_reserved_gb: float  # max held by the caching allocator (what nvidia-smi would show, roughly)
    sdpa_backend: str
    loss: float
    profile_ms: list[tuple[str, float]] | None = None  # CUDA time of one step by kernel kind


def environment() -> dict[str, str]:
    import triton

    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.split("\n")[0]  # one line per GPU
    return {"gpu": torch.cuda.get_device_name(), "driver": driver, "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def train_step_fn(model: torch.nn.Module, raw: GPT, optimizer: torch.optim.Optimizer,
                  batches: torch.Tensor, cuda_graphs: bool = True) -> Callable[[], torch.Tensor]:
    """One optimizer step over batches (grad_accum, B, T+1): gpt2/step.py's, as gpt2.train calls it
    (without DDP, data loading or the outlier guard)."""
    grad_accum = batches.size(0)
    graph = step_fns.MicroStepGraph(model, grad_accum, batches.device, "bfloat16") if cuda_graphs else None

    def step() -> torch.Tensor:
        micro_batches = ((tokens[:, :-1], tokens[:, 1:]) for tokens in batches)  # (B, T) each
        loss = step_fns.forward_backward(model, micro_batches, grad_accum, batches.device, "bfloat16", graph)
        step_fns.clip_gradients(raw.parameters(), 1.0)
        step_fns.optimizer_step(optimizer, 6e-4)
        return loss

    return step


def measure_variant(variant: str, descriptor: str, B: int, T: int, grad_accum: int, steps: int,
                    warmup: int, profile_path: Path | None = None) -> StepResult:
    """Median step time over `steps` after `warmup`; with profile_path, then one profiled step too."""
    spec = VARIANTS[variant]
    # the model looks add_layernorm up when compile traces it: swapped while this variant runs only
    layernorm = (contextlib.nullcontext() if spec.fused_layernorm
                 else unittest.mock.patch.object(gpt2.model, "add_layernorm", inductor_add_layernorm))
    dw = (contextlib.nullcontext() if spec.dw_in_epilogue
          else unittest.mock.patch.object(gpt2_kernels.cross_entropy, "accumulate_dw", separate_add_dw))
    chunk = (contextlib.nullcontext() if spec.chunk_rows is None
             else unittest.mock.patch.object(gpt2.model, "linear_cross_entropy",
                                             functools.partial(linear_cross_entropy, chunk_rows=spec.chunk_rows)))
    with layernorm, dw, chunk:
        return _measure(variant, spec, descriptor, B, T, grad_accum, steps, warmup, profile_path)


def _measure(variant: str, spec: Variant, descriptor: str, B: int, T: int, grad_accum: int, steps: int,
             warmup: int, profile_path: Path | None) -> StepResult:
    config = GPTConfig.from_descriptor(descriptor)
    torch._dynamo.reset()  # each variant compiles from scratch with its own SDPA backend
    torch.cuda.empty_cache()
    if spec.sdpa is None:
        sdpa = "default"
        enable_all_sdpa_backends()  # undo an earlier variant's pinning
    else:
        sdpa = configure_kernels(config.n_head, config.head_size, preference=spec.sdpa,
                                 fa4_backward=spec.fa4_backward, gelu_epilogue=spec.gelu_epilogue,
                                 scaled_exp_classifier=spec.scaled_exp,
                                 keep_mlp_post_bytes=spec.keep_mlp_post_gb * 1e9)
    raw = GPT.create(config, seed=42, device="cuda", use_kernels=spec.use_kernels)
    if spec.fp8:
        convert_blocks_to_fp8(raw)
    optimizer = configure_optimizer(raw, 6e-4, 0.1, fused=True)
    model = torch.compile(raw, mode=spec.compile_mode)
    g = torch.Generator(device="cuda").manual_seed(1337)
    batches = torch.randint(0, config.vocab_size, (grad_accum, B, T + 1), device="cuda", generator=g)
    step = train_step_fn(model, raw, optimizer, batches, spec.cuda_graphs)
    for _ in range(warmup):  # compile, autotune, allocator warm-up
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    dt = sorted(times)[len(times) // 2]
    tokens = grad_accum * B * T
    peak = peak_flops(torch.device("cuda")) or float("nan")  # bf16 dense peak of this GPU (989e12 on H100)
    mfu = flops_per_token(config, raw.num_parameters(), T) * tokens / dt / peak
    result = StepResult(variant, descriptor, B, T, grad_accum, dt * 1e3, tokens / dt, mfu,
                        torch.cuda.max_memory_allocated() / 1e9, torch.cuda.max_memory_reserved() / 1e9,
                        sdpa, float(loss))
    if profile_path is not None:
        result.profile_ms = profile_step(step, profile_path)
    del model, raw, optimizer, step
    return result


def largest_fitting(descriptor: str, batch_sizes: list[int], T: int, total_batch: int) -> StepResult:
    """The kernels variant at the first micro-batch of `batch_sizes` (largest first) that runs without
    running out of GPU memory; 2 timed steps after 1 warm-up."""
    for B in batch_sizes:
        try:
            return measure_variant("kernels", descriptor, B, T, max(1, total_batch // (B * T)), steps=2, warmup=1)
        except torch.OutOfMemoryError:
            print(f"{descriptor} B={B}: out of GPU memory", flush=True)
            torch.cuda.empty_cache()
    raise RuntimeError(f"{descriptor}: none of B={batch_sizes} fits")


def profile_step(step: Callable[[], torch.Tensor], table_path: Path) -> list[tuple[str, float]]:
    """CUDA time of one (warm) optimizer step grouped by kernel kind, in ms, largest first; the
    profiler's per-kernel table goes to table_path."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    table_path.write_text(events.table(sort_by="self_device_time_total", row_limit=60))
    groups: dict[str, float] = {}
    for e in events:
        kind = kernel_kind(e.key)
        groups[kind] = groups.get(kind, 0.0) + e.self_device_time_total / 1e3
    return sorted(((k, ms) for k, ms in groups.items() if ms > 0), key=lambda kv: -kv[1])


def kernel_kind(name: str) -> str:
    n = name.lower()
    # Inductor's kernels first: their names list the graph ops fused around them, ours included
    # (e.g. triton_poi_fused_add_add_layernorm_fwd_embedding_...), and ours are named _<op>_kernel
    if n.startswith("triton_"):
        return "compiled pointwise/reductions (inductor)"
    kinds = [
        ("fused classifier (ours)", ("_cross_entropy_rows",)),
        ("fused add+layernorm (ours)", ("_add_layernorm",)),
        ("attention", ("flash", "fmha", "cudnn", "sdpa", "attention")),
        ("matmul (cuBLAS)", ("gemm", "nvjet", "xmma", "cutlass", "cublas")),
        ("optimizer (fused AdamW)", ("adam",)),
        ("grad-norm clip", ("multi_tensor", "norm", "foreach")),
        ("eager elementwise (casts, adds, copies)", ("elementwise", "reduce_kernel", "copy")),
    ]
    return next((kind for kind, keys in kinds if any(k in n for k in keys)), "other")


def format_profile(groups: list[tuple[str, float]]) -> str:
    total = sum(ms for _, ms in groups)
    rows = [f"| {kind} | {ms:.1f} | {100 * ms / total:.1f}% |" for kind, ms in groups]
    return "\n".join(["CUDA time of one optimizer step by kernel kind:",
                      "| kind | ms | share |", "| --- | ---: | ---: |", *rows, f"| total | {total:.1f} | |"])


def format_steps(results: list[StepResult], peer_tokens_per_s: float | None = None) -> str:
    lines = ["| variant | model | B x T x accum | SDPA | step ms | tokens/s | MFU | peak alloc GB | peak reserved GB |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        lines.append(f"| {r.variant} | {r.model} | {r.B} x {r.T} x {r.grad_accum} | {r.sdpa_backend} | "
                     f"{r.step_ms:.1f} | {r.tokens_per_s:,.0f} | {100 * r.mfu:.1f}% | {r.peak_mem_gb:.1f} | "
                     f"{r.peak_reserved_gb:.1f} |")
    same_model = [r for r in results if r.model == results[0].model]
    peers = {"plain (in this process)": next((r.tokens_per_s for r in same_model if r.variant == "plain"), None),
             "build-nanogpt (--peer)": peer_tokens_per_s}
    for peer, tokens_per_s in peers.items():
        if tokens_per_s:
            lines.append("")
            lines += [f"{r.variant} / {peer}: {r.tokens_per_s / tokens_per_s:.3f}x"
                      for r in same_model if r.variant != "plain"]
    return "\n".join(lines)


def _raise_timeout(signum, frame) -> None:
    raise TimeoutError("section ran past --section-timeout")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="d12", help="model descriptor (default d12)")
    parser.add_argument("--batch-size", type=int, default=64, help="micro-batch B (default 64)")
    parser.add_argument("--seq-len", type=int, default=1024, help="sequence length T (default 1024)")
    parser.add_argument("--total-batch", type=int, default=524288,
                        help="tokens per optimizer step; grad_accum = total / (B*T) (default 524288)")
    parser.add_argument("--grad-accum", type=int, default=None,
                        help="override the micro-steps per timed step (steady state is per micro-step)")
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps per variant (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (compile) (default 1)")
    parser.add_argument("--variants", nargs="*", default=["kernels", "plain"], choices=list(VARIANTS),
                        help="default: kernels plain; none with --variants alone")
    parser.add_argument("--no-kernel-table", action="store_true", help="skip the per-kernel timings")
    parser.add_argument("--no-profile", action="store_true", help="skip the per-kernel-kind profile")
    parser.add_argument("--numerics-steps", type=int, default=50, help="0 skips the numerics check (default 50)")
    parser.add_argument("--extra", nargs="*", default=[], metavar="MODEL:B",
                        help="also time the kernels variant of these, e.g. d24:16 (grad_accum from --total-batch); "
                             "MODEL:B1,B2,... tries each micro-batch in turn and keeps the first that fits")
    parser.add_argument("--extra-total-batch", type=int, default=None,
                        help="tokens per optimizer step of the --extra runs (default --total-batch); fewer "
                             "micro-steps per timed step shorten the run, the per-micro-step rate is the same")
    parser.add_argument("--peer", help="JSON written by bench.peer_nanogpt --out: print each variant's ratio to it")
    parser.add_argument("--section-timeout", type=int, default=300,
                        help="seconds before a part (one variant, the kernel table, ...) is abandoned (default 300)")
    parser.add_argument("--out", default="artifacts/bench", help="folder for JSON, profile and log files")
    args = parser.parse_args()
    configure_cuda_allocator()  # before CUDA starts, as gpt2.train's set-up does
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGALRM, _raise_timeout)
    torch.backends.cuda.matmul.allow_tf32 = True  # as gpt2.train sets it
    torch.backends.cudnn.allow_tf32 = True

    report: dict = {"env": environment(), "args": vars(args)}
    print(json.dumps(report["env"]), flush=True)
    sections: list[str] = []

    def section(name: str, fn: Callable[[], str]) -> None:
        """Run one part; a failure or a stall past --section-timeout is logged with its traceback and
        the other parts still run (GPU sessions are short: one stuck compile must not eat the rest)."""
        t0 = time.perf_counter()
        signal.alarm(args.section_timeout)
        try:
            text = fn()
        except Exception:  # noqa: BLE001 - keep the rest of the benchmark
            text = f"FAILED:\n{traceback.format_exc()}"
        finally:
            signal.alarm(0)
        sections.append(f"## {name} ({time.perf_counter() - t0:.0f} s)\n{text}")
        print(sections[-1], flush=True)
        (out_dir / "bench.json").write_text(json.dumps(report, indent=1, default=str))

    B, T = args.batch_size, args.seq_len
    grad_accum = args.grad_accum or args.total_batch // (B * T)
    results: list[StepResult] = []

    def record(r: StepResult) -> StepResult:
        results.append(r)
        report["steps"] = [asdict(x) for x in results]
        return r

    def steps_section(variant: str) -> str:
        profile = None if args.no_profile else out_dir / f"profile_{variant}.txt"
        r = record(measure_variant(variant, args.model, B, T, grad_accum, args.steps, args.warmup, profile))
        return "\n\n".join([format_steps([r])] + ([format_profile(r.profile_ms)] if r.profile_ms else []))

    for variant in args.variants:  # one section each: an OOM in one still leaves the other
        section(f"train step: {variant}", lambda variant=variant: steps_section(variant))
    if not args.no_kernel_table:
        from bench.bench_kernels import format_table, run_all

        def kernels_section() -> str:
            ceil, rows = run_all(GPTConfig.from_descriptor(args.model), B, T, (8192, 16384))
            report["kernels"] = {"ceilings": asdict(ceil), "rows": [asdict(r) for r in rows]}
            return format_table(ceil, rows)

        section("per kernel", kernels_section)
    if args.numerics_steps:
        from bench.numerics import compare_paths

        def numerics_section() -> str:
            result = compare_paths(args.model, B=8, T=T, steps=args.numerics_steps)
            report["numerics"] = result
            return result["summary"]

        section("numerics: kernels and plain bf16 vs fp32", numerics_section)
    for spec in args.extra:
        model, batch_sizes = spec.split(":")

        def extra_section(model=model, batch_sizes=[int(b) for b in batch_sizes.split(",")]) -> str:
            r = record(largest_fitting(model, batch_sizes, T, args.extra_total_batch or args.total_batch))
            return format_steps([r])

        section(f"kernels {model} B in {batch_sizes}", extra_section)

    peer = json.loads(Path(args.peer).read_text())["tokens_per_s"] if args.peer else None
    summary = "\n\n".join(sections)
    (out_dir / "bench.md").write_text(f"{json.dumps(report['env'])}\n\n{summary}\n")
    print("\n# summary\n" + format_steps(results, peer) if results else "no step results", flush=True)


if __name__ == "__main__":
    main()
