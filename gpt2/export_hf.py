"""`python -m gpt2.export_hf`: a checkpoint (or run, llm.c model file, HF directory) as a Hugging Face directory.

The directory (gpt2.hf.export_hf) holds model.safetensors, config.json and GPT-2's tokenizer files, built
offline, so `GPT2LMHeadModel.from_pretrained(out)` and `AutoTokenizer.from_pretrained(out)` load it
without a network.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from common.cli import run_cli
from gpt2.hf import export_hf
from gpt2.weights import MODEL_SOURCE_HELP, load_model


def export_checkpoint(source: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False) -> tuple[Path, int | None]:
    """Export the model `source` names (see MODEL_SOURCE_HELP) to `out_dir`; returns (out_dir, its step or None)."""
    model, step = load_model(source)
    return export_hf(model, out_dir, overwrite=overwrite), step


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpt2.export_hf",
        description="Export a model as a Hugging Face GPT-2 directory (model.safetensors, config.json, tokenizer "
        "files) that transformers' GPT2LMHeadModel and AutoTokenizer load offline.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--checkpoint", required=True, help=MODEL_SOURCE_HELP)
    parser.add_argument("--out", required=True, help="directory to write; created, or replaced with --force")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists and is not empty")
    return parser


def main(argv: list[str] | None = None) -> Path:
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    try:
        out, step = export_checkpoint(args.checkpoint, args.out, overwrite=args.force)
    except (OSError, ValueError) as e:  # a source that is not a model, an --out in the way: the message says
        parser.exit(1, f"{parser.prog}: error: {e}\n")
    at = "" if step is None else f" (step {step})"
    print(f"exported {args.checkpoint}{at} to {out}", flush=True)
    return out


if __name__ == "__main__":
    run_cli(main)
