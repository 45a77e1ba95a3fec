"""Text samples (top-k) from a model, in the training loop and as a CLI.

    python -m gpt2.sample --checkpoint artifacts/runs/gpt2-124M --prompt "Hello, I'm a language model,"

`--checkpoint` takes our checkpoint directory (or a run directory), an llm.c model file, or a Hugging
Face GPT-2 directory. Sampling draws from its own seeded generator, so it never disturbs (and is not
disturbed by) the global RNG state of a training run.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from common.cli import run_cli
from common.files import write_json
from gpt2.config import DEVICE_HELP, DEVICES
from gpt2.distributed import autocast_context, resolve_device
from gpt2.model import GPT
from gpt2.train_config import TrainConfig
from gpt2.weights import MODEL_SOURCE_HELP, load_model


@torch.no_grad()
def generate(
    model: GPT,
    prompt: torch.Tensor,
    max_new_tokens: int,
    top_k: int = 50,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    dtype: str = "auto",
) -> torch.Tensor:
    """(B, T0) prompt tokens -> (B, T0 + max_new_tokens); top-k sampling, context cropped to block_size."""
    model.eval()
    idx = prompt
    for _ in range(max_new_tokens):
        context = idx[:, -model.config.block_size :]
        with autocast_context(idx.device, dtype):
            logits, _ = model(context)
        logits = logits[:, -1, :].float() / temperature  # (B, V): next-token logits only
        if top_k:
            kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]  # (B, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = F.softmax(logits, dim=-1)
        next_token = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
        idx = torch.cat([idx, next_token], dim=1)
    return idx


def sample_text(
    model: GPT, prompt: str, max_new_tokens: int, num_samples: int = 1, top_k: int = 50, temperature: float = 1.0,
    seed: int = 42, dtype: str = "auto",
) -> list[str]:
    """Decoded samples continuing `prompt` (GPT-2 tokenizer), reproducible for a given seed."""
    from data.tokenizer import get_gpt2_encoding

    enc = get_gpt2_encoding()
    device = next(model.parameters()).device
    prompt_tokens = torch.tensor(enc.encode_ordinary(prompt), dtype=torch.long, device=device)
    prompt_tokens = prompt_tokens.unsqueeze(0).repeat(num_samples, 1)  # (num_samples, T0)
    generator = torch.Generator(device=device).manual_seed(seed)
    out = generate(model, prompt_tokens, max_new_tokens, top_k, temperature, generator, dtype)
    return [enc.decode(row.tolist()) for row in out]


def build_arg_parser() -> argparse.ArgumentParser:
    defaults = TrainConfig()  # the training loop's samples: same prompt, length and seed
    parser = argparse.ArgumentParser(
        prog="python -m gpt2.sample",
        description="Sample text from a checkpoint, llm.c model file or Hugging Face directory (top-k).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--checkpoint", required=True, help=MODEL_SOURCE_HELP)
    parser.add_argument("--prompt", default=defaults.sample_prompt, help="text to continue")
    parser.add_argument("--num-samples", type=int, default=4, help="independent samples")
    parser.add_argument("--max-new-tokens", type=int, default=defaults.sample_tokens,
                        help="tokens generated per sample")
    parser.add_argument("--top-k", type=int, default=50, help="sample among the k most likely tokens; 0: all")
    parser.add_argument("--temperature", type=float, default=1.0, help="softmax temperature")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the sampling generator")
    parser.add_argument("--device", default="auto", choices=DEVICES, help=DEVICE_HELP)
    parser.add_argument("--out", help="also write the samples as JSON here (atomically)")
    return parser


def main(argv: list[str] | None = None) -> list[str]:
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    if args.num_samples <= 0 or args.max_new_tokens < 0 or args.top_k < 0 or args.temperature <= 0:
        parser.error("--num-samples and --temperature must be positive, --max-new-tokens and --top-k >= 0")

    model, step = load_model(args.checkpoint, device=resolve_device(args.device))
    samples = sample_text(model, args.prompt, args.max_new_tokens, args.num_samples, args.top_k, args.temperature,
                          args.seed)
    for i, text in enumerate(samples):
        print(f"--- sample {i}\n{text}", flush=True)
    if args.out:
        write_json(args.out, {"checkpoint": str(args.checkpoint), "step": step, "prompt": args.prompt,
                              "seed": args.seed, "top_k": args.top_k, "temperature": args.temperature,
                              "max_new_tokens": args.max_new_tokens, "samples": samples})
    return samples


if __name__ == "__main__":
    run_cli(main)
