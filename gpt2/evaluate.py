"""Evaluation: val loss over the val shard and HellaSwag accuracy, in the training loop and as a CLI.

    python -m gpt2.evaluate --checkpoint artifacts/runs/gpt2-124M --val-data 'shards/*_val_*.bin' \\
        --hellaswag artifacts/eval/hellaswag_val.bin --out eval.json

`--checkpoint` takes our checkpoint directory (or a run directory: its newest checkpoint that verifies),
an llm.c model file, or a Hugging Face GPT-2 directory. Also runs under torchrun: every rank scores
its own slice and the results are reduced.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch
import torch.nn as nn

from common.cli import run_cli
from common.files import json_text, write_json
from data.loader import DistributedDataLoader
from gpt2.config import DEVICE_HELP, DEVICES, DTYPES
from gpt2.distributed import DistContext, all_reduce_mean, all_reduce_sum, autocast_context, setup, teardown
from gpt2.train_config import TrainConfig
from gpt2.weights import MODEL_SOURCE_HELP, load_model


@torch.no_grad()
def val_loss(model: nn.Module, loader: Any, steps: int, ctx: DistContext, dtype: str = "auto") -> float:
    """Mean loss over the first `steps` batches of every rank's slice of the val data, averaged over ranks.

    The loader is reset first, so every evaluation sees the same tokens. Leaves the model in eval mode.
    """
    model.eval()
    loader.reset()
    total = torch.zeros((), device=ctx.device)
    for _ in range(steps):
        x, y = loader.next_batch()
        with autocast_context(ctx.device, dtype):
            _, loss = model(x.to(ctx.device), y.to(ctx.device), return_logits=False)
        total += loss.float()
    return all_reduce_mean(total / steps, ctx).item()


@torch.no_grad()
def hellaswag(model: nn.Module, eval_path: str | os.PathLike, ctx: DistContext, dtype: str = "auto") -> dict:
    """{"acc", "acc_norm", "n"} on a HellaSwag eval file, examples spread over ranks (data.hellaswag)."""
    from data.hellaswag import evaluate

    model.eval()

    def logits_fn(tokens: torch.Tensor) -> torch.Tensor:  # (rows, T) -> (rows, T, V)
        with autocast_context(ctx.device, dtype):
            logits, _ = model(tokens.to(ctx.device))
        return logits  # autocast dtype: the scorer converts only the ending positions to fp32

    def sum_over_ranks(counts: list[int]) -> list[int]:
        return all_reduce_sum(torch.tensor(counts, dtype=torch.long, device=ctx.device), ctx).tolist()

    return evaluate(logits_fn, eval_path, rank=ctx.rank, world_size=ctx.world_size, all_reduce=sum_over_ranks,
                    progress=sys.stderr.isatty())


def evaluate_model(
    model: nn.Module,
    ctx: DistContext,
    val_data: str | None = None,
    hellaswag_path: str | None = None,
    batch_size: int = 64,
    seq_len: int = 1024,
    val_steps: int = 20,
    dtype: str = "auto",
) -> dict[str, Any]:
    """{"val_loss": ..., "hellaswag": {...}} for whichever of the two evaluations are asked for."""
    result: dict[str, Any] = {"val_loss": None, "hellaswag": None}
    if val_data:
        loader = DistributedDataLoader(val_data, batch_size, seq_len, ctx.rank, ctx.world_size, order="file",
                                       split="val")
        result["val_loss"] = val_loss(model, loader, val_steps, ctx, dtype)
        result["val_tokens"] = val_steps * batch_size * seq_len * ctx.world_size
    if hellaswag_path:
        result["hellaswag"] = hellaswag(model, hellaswag_path, ctx, dtype)
    return result


def build_arg_parser() -> argparse.ArgumentParser:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(
        prog="python -m gpt2.evaluate",
        description="Val loss and HellaSwag accuracy of a checkpoint, llm.c model file or Hugging Face directory.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--checkpoint", required=True, help=MODEL_SOURCE_HELP)
    parser.add_argument("--val-data", help="a shard folder's manifest.json (its val shards) or a glob of val token "
                        "shards (*_val_*.bin); unset: no val loss")
    parser.add_argument("--hellaswag", help="HellaSwag eval file (data.hellaswag); unset: no HellaSwag")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="val batch size B per rank")
    parser.add_argument("--seq-len", type=int, default=defaults.seq_len, help="val sequence length T")
    parser.add_argument("--val-steps", type=int, default=defaults.val_steps, help="val batches per rank")
    parser.add_argument("--out", help="also write the result as JSON here (atomically)")
    parser.add_argument("--device", default="auto", choices=DEVICES, help=DEVICE_HELP)
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="autocast dtype (auto: bfloat16 on CUDA, float32 on CPU)")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    if not (args.val_data or args.hellaswag):
        parser.error("nothing to evaluate: pass --val-data and/or --hellaswag")
    if min(args.batch_size, args.seq_len, args.val_steps) <= 0:
        parser.error("--batch-size, --seq-len and --val-steps must be positive")

    ctx = setup(args.device)
    clean = False
    try:
        model, step = load_model(args.checkpoint, device=ctx.device)
        if args.seq_len > model.config.block_size:
            parser.error(f"--seq-len {args.seq_len} exceeds the model's max_seq_len {model.config.block_size}")
        result = {"checkpoint": str(args.checkpoint), "step": step}
        result.update(evaluate_model(model, ctx, args.val_data, args.hellaswag, args.batch_size, args.seq_len,
                                     args.val_steps, args.dtype))
        if ctx.is_master:
            print(json_text(result, "the result on stdout"), flush=True)
            if args.out:
                write_json(args.out, result)
        clean = True
        return result
    finally:
        teardown(clean)


if __name__ == "__main__":
    run_cli(main)
