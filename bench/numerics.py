"""Numerics check: N training steps of the kernels path, the plain path and an fp32 reference, same
init and batches.

The kernels and plain paths both train under bf16 autocast, so neither reproduces exact arithmetic:
every matmul rounds its output to bf16 (2^-9 relative) and training carries those differences
forward. The question is whether the kernels path is any further from exact arithmetic than plain
bf16 training is. So a third run is the reference: the plain path in fp32 (autocast off, TF32 off,
SDPA math backend), and

    bf16 noise = max over steps |loss_plain_bf16 - loss_fp32|
    error      = max over steps |loss_kernels_bf16 - loss_fp32|
    PASS if error <= max(TOL_ABS, 2 x bf16 noise)

`--check kernels-fp8` puts the same question to the kernels path with its block matmuls in FP8
(bench/fp8.py, torchao's float8 training): is it any further from exact arithmetic than bf16 is?

TOL_ABS = 0.02 is about one bf16 rounding unit of the loss itself (2^-9 x ~10), the resolution at
which a bf16 model's loss is defined at all. The factor 2 leaves room for the kernels path's own,
different but equally valid, rounding order. First-step gradients are compared per parameter too
(relative L2 error against fp32, kernels and plain side by side): a wrong gradient shows there even
when the losses still agree.

The learning rate follows llm.c's recipe for the model's size (its scripts/run_gpt2_*.sh: peak 6e-4 at 124M,
3e-4 at 350M, 2.5e-4 at 774M, 6e-4 at 1.5B, each warmed up linearly over 700 steps); the check's steps are the
first steps of that schedule. A rate far above it (d12's 6e-4 reached in 10 steps, at d24 and d48) made the fp32
reference itself diverge for a few steps, and in such jumps any two roundings part by whole units of loss, so the
check measured the instability rather than the arithmetic. `--lr` and `--warmup-steps` override the recipe.

Data are synthetic but learnable (Zipf-distributed tokens with a deterministic successor half of the
time), so the loss falls and the comparison covers real training dynamics, not a flat line at ln V.
Eager mode (no compile): the point is the arithmetic, not speed.

    python -m bench.numerics --help
"""

from __future__ import annotations

import argparse
import contextlib
import json
from dataclasses import dataclass

import torch

from gpt2.config import GPTConfig
from gpt2 import step as step_fns
from bench.fp8 import convert_blocks_to_fp8
from gpt2.model import GPT
from gpt2.optim import configure_optimizer, lr_at
from gpt2.train_config import TrainConfig
from gpt2_kernels import configure_kernels

TOL_ABS = 0.02
# llm.c's scripts/run_gpt2_{124M,350M,774M,1558M}.sh: the peak learning rate by model size, all warmed up over 700
# steps; a size not among them gets the 124M recipe's, the one this project reproduces
RECIPE_PEAK_LR = {"d12": 6e-4, "d24": 3e-4, "d36": 2.5e-4, "d48": 6e-4}
RECIPE_WARMUP_STEPS = 700


def recipe_schedule(descriptor: str) -> tuple[float, int]:
    """(peak learning rate, warmup steps) of llm.c's recipe for this model size."""
    return RECIPE_PEAK_LR.get(descriptor, RECIPE_PEAK_LR["d12"]), RECIPE_WARMUP_STEPS


@dataclass(frozen=True)
class Path:
    use_kernels: bool
    bf16: bool  # bf16 autocast; False: fp32 with TF32 off
    sdpa: tuple[str, ...]  # SDPA backend preference (gpt2_kernels.configure_kernels)
    fp8: bool = False  # the blocks' matmuls in FP8 (bench/fp8.py)


PATHS = {
    "fp32": Path(use_kernels=False, bf16=False, sdpa=("math",)),  # the reference: exact fp32 attention too
    "plain": Path(use_kernels=False, bf16=True, sdpa=("flash",)),  # the yardstick: plain bf16 training
    "kernels": Path(use_kernels=True, bf16=True, sdpa=("cudnn", "flash")),
    "kernels-fp8": Path(use_kernels=True, bf16=True, sdpa=("cudnn", "flash"), fp8=True),
}
CHECKABLE = [name for name in PATHS if name not in ("fp32", "plain")]


def synthetic_batches(vocab_size: int, steps: int, B: int, T: int, seed: int = 0) -> torch.Tensor:
    """(steps, B, T+1) int64 tokens: Zipf(1.1) draws, each followed half the time by a fixed successor."""
    g = torch.Generator().manual_seed(seed)
    probs = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64) ** 1.1
    draws = torch.multinomial(probs, steps * B * (T + 1), replacement=True, generator=g).view(steps * B, T + 1)
    follow = torch.rand(steps * B, T + 1, generator=g) < 0.5
    tokens = draws.clone()
    for t in range(1, T + 1):  # successor of token a is (7a + 3) mod V
        tokens[:, t] = torch.where(follow[:, t], (7 * tokens[:, t - 1] + 3) % vocab_size, draws[:, t])
    return tokens.view(steps, B, T + 1)


@contextlib.contextmanager
def exact_fp32():
    """TF32 off for matmuls and cuDNN inside; the caller's settings restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def train_path(descriptor: str, path: Path, batches: torch.Tensor, lr: float,
               warmup_steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """-> (loss per step, first step's gradients by parameter name (fp32, CPU, before clipping))."""
    config = GPTConfig.from_descriptor(descriptor)
    configure_kernels(config.n_head, config.head_size, dtype=torch.bfloat16 if path.bf16 else torch.float32,
                      preference=path.sdpa, keep_mlp_post_bytes=TrainConfig.keep_mlp_post_gb * 1e9)  # gpt2.train's
    model = GPT.create(config, seed=42, device="cuda", use_kernels=path.use_kernels)
    if path.fp8:
        convert_blocks_to_fp8(model)
    optimizer = configure_optimizer(model, lr, 0.1, fused=True)
    steps = batches.size(0)
    device = torch.device("cuda")
    losses, first_grads = [], {}
    with contextlib.nullcontext() if path.bf16 else exact_fp32():
        for step, tokens in enumerate(batches.to(device)):  # gpt2/step.py's step, one micro-batch
            micro_batch = [(tokens[:, :-1], tokens[:, 1:])]
            loss = step_fns.forward_backward(model, micro_batch, 1, device, "bfloat16" if path.bf16 else "float32")
            if step == 0:
                first_grads = {name: p.grad.float().cpu() for name, p in model.named_parameters()}
            step_fns.clip_gradients(model.parameters(), 1.0)
            step_fns.optimizer_step(optimizer, lr_at(step, lr, steps, warmup_steps=warmup_steps))
            losses.append(loss.item())
    return losses, first_grads


def grad_errors(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, float]:
    """Relative L2 error of each parameter's gradient against the reference's."""
    return {name: float((g - reference[name]).norm() / reference[name].norm().clamp_min(1e-30))
            for name, g in grads.items()}


def compare_paths(descriptor: str = "d12", B: int = 8, T: int = 1024, steps: int = 50,
                  checked: tuple[str, ...] = ("kernels",), lr: float | None = None,
                  warmup_steps: int | None = None) -> dict:
    """Trains fp32, plain and each `checked` path on the same batches; each checked path passes when its
    loss stays within max(TOL_ABS, 2 x bf16 noise) of fp32's at every step. The learning rate and warmup
    default to llm.c's recipe for the size (recipe_schedule)."""
    recipe_lr, recipe_warmup = recipe_schedule(descriptor)
    lr = recipe_lr if lr is None else lr
    warmup_steps = recipe_warmup if warmup_steps is None else warmup_steps
    batches = synthetic_batches(GPTConfig.from_descriptor(descriptor).vocab_size, steps, B, T)
    losses, grads = {}, {}
    for name in ("fp32", "plain", *checked):
        losses[name], grads[name] = train_path(descriptor, PATHS[name], batches, lr, warmup_steps)
        torch.cuda.empty_cache()

    def max_diff(a: str, b: str) -> float:
        return max(abs(x - y) for x, y in zip(losses[a], losses[b]))

    noise = max_diff("plain", "fp32")
    tolerance = max(TOL_ABS, 2 * noise)
    errors = {name: max_diff(name, "fp32") for name in checked}
    grad_errs = {name: grad_errors(grads[name], grads["fp32"]) for name in ("plain", *checked)}
    lines = [f"{descriptor} B={B} T={T}, {steps} steps, lr {lr:g} warmed up over {warmup_steps} steps: "
             f"loss {losses['fp32'][0]:.4f} -> {losses['fp32'][-1]:.4f} (fp32); bf16 noise max |plain - fp32| = {noise:.4f}; tolerance max({TOL_ABS}, 2 x noise) = "
             f"{tolerance:.4f}"]
    for name in checked:
        worst = sorted(grad_errs[name], key=lambda n: -grad_errs[name][n])[:5]
        lines += [f"max |{name} - fp32| = {errors[name]:.4f}: {'PASS' if errors[name] <= tolerance else 'FAIL'} "
                  f"(max |{name} - plain| = {max_diff(name, 'plain'):.4f})",
                  f"first-step gradients, relative L2 error vs fp32, max over parameters: {name} "
                  f"{max(grad_errs[name].values()):.2e}, plain {max(grad_errs['plain'].values()):.2e}; "
                  f"worst for {name}:",
                  *(f"  {n}: {name} {grad_errs[name][n]:.2e}, plain {grad_errs['plain'][n]:.2e}" for n in worst)]
    return {"lr": lr, "warmup_steps": warmup_steps, "losses": losses, "grad_errors": grad_errs,
            "max_error": errors, "noise": noise, "tolerance": tolerance, "passed": all(e <= tolerance for e in errors.values()),
            "summary": "\n".join(lines)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="d12", help="model descriptor (default d12)")
    parser.add_argument("--batch-size", type=int, default=8, help="B (default 8)")
    parser.add_argument("--seq-len", type=int, default=1024, help="T (default 1024)")
    parser.add_argument("--steps", type=int, default=50, help="training steps per path (default 50)")
    parser.add_argument("--check", nargs="+", default=["kernels"], choices=CHECKABLE,
                        help="the paths held to the criterion (default: kernels)")
    parser.add_argument("--lr", type=float, help="peak learning rate (default: llm.c's recipe for the size)")
    parser.add_argument("--warmup-steps", type=int, help="linear warmup steps (default: llm.c's, 700)")
    parser.add_argument("--json", help="also write losses, gradient errors and verdict to this JSON file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    result = compare_paths(args.model, args.batch_size, args.seq_len, args.steps, tuple(args.check), args.lr,
                           args.warmup_steps)
    print(result["summary"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
