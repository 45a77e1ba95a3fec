"""Numerics check: N training steps with the kernels path and with the plain path, same init and batches.

Both paths run bf16 autocast, so they can only agree to bf16 noise: every matmul rounds its output
to bf16 (2^-9 relative), and a different but equally valid order of the same arithmetic moves the
loss by a little, which training then carries forward. To measure that noise rather than guess it,
the plain path is also run with another SDPA backend (efficient instead of flash): same model, same
math, different rounding. Tolerance: the kernels path may differ from the plain path by at most
max(TOL_ABS, 2 x that measured noise) at every step. TOL_ABS = 0.02 is about one bf16 rounding unit
of the loss itself (2^-9 x ~10), the resolution at which a bf16 model's loss is defined at all.

Data are synthetic but learnable (Zipf-distributed tokens with a deterministic successor half of the
time), so the loss falls and the comparison covers real training dynamics, not a flat line at ln V.
Eager mode (no compile): the point is the arithmetic, not speed.

    python -m bench.numerics --help
"""

from __future__ import annotations

import argparse
import json

import torch

from gpt2.config import GPTConfig
from gpt2.distributed import autocast_context
from gpt2.model import GPT
from gpt2.optim import configure_optimizer, lr_at
from kernels.attention import configure_sdpa

TOL_ABS = 0.02
PATHS = {  # name -> (use_kernels, SDPA preference)
    "plain": (False, ("flash",)),
    "plain-efficient": (False, ("efficient",)),  # the noise reference
    "kernels": (True, ("cudnn", "flash")),
}


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


def train_losses(descriptor: str, use_kernels: bool, sdpa: tuple[str, ...], batches: torch.Tensor) -> list[float]:
    config = GPTConfig.from_descriptor(descriptor)
    configure_sdpa(config.n_head, config.head_size, preference=sdpa)
    model = GPT.create(config, seed=42, device="cuda", use_kernels=use_kernels)
    optimizer = configure_optimizer(model, 6e-4, 0.1, fused=True)
    steps = batches.size(0)
    losses = []
    for step, tokens in enumerate(batches.cuda()):
        with autocast_context(tokens.device, "bfloat16"):
            _, loss = model(tokens[:, :-1], tokens[:, 1:], return_logits=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, 6e-4, steps, warmup_steps=10)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def compare_paths(descriptor: str = "d12", B: int = 8, T: int = 1024, steps: int = 50) -> dict:
    batches = synthetic_batches(GPTConfig.from_descriptor(descriptor).vocab_size, steps, B, T)
    losses = {name: train_losses(descriptor, k, sdpa, batches) for name, (k, sdpa) in PATHS.items()}

    def max_diff(a: str, b: str) -> float:
        return max(abs(x - y) for x, y in zip(losses[a], losses[b]))

    noise = max_diff("plain", "plain-efficient")
    diff = max_diff("kernels", "plain")
    tolerance = max(TOL_ABS, 2 * noise)
    summary = (f"{descriptor} B={B} T={T}, {steps} steps: loss {losses['plain'][0]:.4f} -> {losses['plain'][-1]:.4f} "
               f"(plain); max |kernels - plain| = {diff:.4f}; measured bf16 noise max |plain(flash) - "
               f"plain(efficient)| = {noise:.4f}; tolerance {tolerance:.4f}: {'PASS' if diff <= tolerance else 'FAIL'}")
    return {"losses": losses, "max_diff": diff, "noise": noise, "tolerance": tolerance,
            "passed": diff <= tolerance, "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="d12", help="model descriptor (default d12)")
    parser.add_argument("--batch-size", type=int, default=8, help="B (default 8)")
    parser.add_argument("--seq-len", type=int, default=1024, help="T (default 1024)")
    parser.add_argument("--steps", type=int, default=50, help="training steps per path (default 50)")
    parser.add_argument("--json", help="also write losses and verdict to this JSON file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    result = compare_paths(args.model, args.batch_size, args.seq_len, args.steps)
    print(result["summary"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
