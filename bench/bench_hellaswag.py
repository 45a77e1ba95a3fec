"""HellaSwag scoring speed by `examples_per_batch`: data.hellaswag.evaluate on a GPT-2 model, one GPU.

The eval file is generated (no network): 10,042 examples (HellaSwag val's size) of random tokens whose
context and ending lengths are drawn uniformly from --ctx-len and --ending-len. The model is initialised,
not trained: speed does not depend on the weights. The logits come from the same bf16-autocast forward
as gpt2.evaluate.hellaswag. Per setting: wall time after one warm-up batch, examples/s, the peak of
allocated GPU memory, and the counts, which should agree across settings up to bf16 near-ties.

    python bench/bench_hellaswag.py --examples-per-batch 1 16 64
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from data.hellaswag import NUM_ENDINGS, Example, evaluate, write_eval_file
from gpt2.distributed import autocast_context
from gpt2.model import GPT


def synthetic_examples(n: int, ctx_len: tuple[int, int], ending_len: tuple[int, int], seed: int = 0) -> list[Example]:
    rng = np.random.default_rng(seed)

    def tokens(lo: int, hi: int) -> list[int]:
        return rng.integers(0, 50257, int(rng.integers(lo, hi + 1))).tolist()

    return [Example(index=i, label=int(rng.integers(NUM_ENDINGS)), ctx_tokens=tokens(*ctx_len),
                    ending_tokens=[tokens(*ending_len) for _ in range(NUM_ENDINGS)]) for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="d12", help="llm.c model descriptor")
    parser.add_argument("--examples", type=int, default=10_042)
    parser.add_argument("--examples-per-batch", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--ctx-len", type=int, nargs=2, default=[15, 90], metavar=("MIN", "MAX"))
    parser.add_argument("--ending-len", type=int, nargs=2, default=[8, 40], metavar=("MIN", "MAX"))
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    device = torch.device(args.device)
    model = GPT.from_descriptor(args.model, device=device).eval()

    def logits_fn(tokens: torch.Tensor) -> torch.Tensor:
        with autocast_context(device):
            return model(tokens.to(device))[0]

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hellaswag_synthetic.bin"
        write_eval_file(path, synthetic_examples(args.examples, tuple(args.ctx_len), tuple(args.ending_len)))
        for examples_per_batch in args.examples_per_batch:
            evaluate(logits_fn, path, limit=examples_per_batch, examples_per_batch=examples_per_batch,
                     progress=False)  # warm-up; evaluate runs logits_fn under torch.no_grad itself
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            result = evaluate(logits_fn, path, examples_per_batch=examples_per_batch, progress=False)
            seconds = time.perf_counter() - start  # evaluate returns host ints: the GPU is done
            peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
            print(json.dumps({"examples_per_batch": examples_per_batch, "seconds": round(seconds, 2),
                              "examples_per_s": round(result["n"] / seconds), "peak_gib": round(peak, 2),
                              "correct": result["correct"], "correct_norm": result["correct_norm"]}), flush=True)


if __name__ == "__main__":
    main()
