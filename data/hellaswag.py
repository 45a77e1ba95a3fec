"""HellaSwag: download, completion-style rendering, llm.c's eval file, and a distributable scorer.

Rendering (as llm.c's dev/data/hellaswag.py): the context is `encode(ctx)`, each of the 4 endings is
`encode(" " + ending)`; the model sees context + ending. Scoring: the loss at position t predicts token
t+1; for each ending, take the sum and the mean of the losses over the ending's tokens. The prediction for
`acc` is the ending with the lowest sum, for `acc_norm` the lowest mean; ties go to the lowest index.

Eval file (llm.c, magic 20240522): a header of 256 int32 `[0]=20240522, [1]=1, [2]=n_examples,
[3]=longest example in bytes`, then per example a uint16 stream `65535, example_bytes, index, label, 4,
ctx_len, ctx..., then 4 x (ending_len, ending...)`, where example_bytes counts the whole example.

CLI: `python -m data.hellaswag --out DIR [--source PATH_OR_URL]` writes DIR/hellaswag_val.jsonl and
DIR/hellaswag_val.bin.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tiktoken
import torch
import torch.nn.functional as F
from tqdm import tqdm

from data.files import atomic_path
from data.tokenizer import get_gpt2_encoding

HELLASWAG_VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
JSONL_NAME = "hellaswag_val.jsonl"
EVAL_NAME = "hellaswag_val.bin"
MAGIC = 20240522
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
START_EXAMPLE = 2**16 - 1
NUM_ENDINGS = 4
EXAMPLE_FIELDS = 5  # START_EXAMPLE, example_bytes, index, label, number of endings


class EvalFileError(ValueError):
    """A HellaSwag jsonl or eval file is malformed; the message names the file and the example."""


@dataclass(frozen=True)
class Example:
    index: int  # position in the source jsonl
    label: int  # index of the correct ending
    ctx_tokens: list[int]
    ending_tokens: list[list[int]]  # NUM_ENDINGS lists


# ---------------------------------------------------------------------------------------------------------
# source jsonl


def download(dest: str | os.PathLike, source: str | os.PathLike = HELLASWAG_VAL_URL, timeout_s: float = 60) -> Path:
    """Put the HellaSwag val jsonl at dest/hellaswag_val.jsonl (kept if already there); return its path.

    source: the URL to download (default: the official val split) or a local jsonl file to copy.
    """
    out = Path(dest) / JSONL_NAME
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        if Path(source).is_file():
            shutil.copyfile(source, tmp)
        else:
            with urllib.request.urlopen(str(source), timeout=timeout_s) as response, open(tmp, "wb") as f:
                shutil.copyfileobj(response, f)
        for _ in iter_jsonl(tmp, name=str(source)):  # validate before it gets the final name
            pass
    return out


def iter_jsonl(path: str | os.PathLike, name: str | None = None) -> Iterator[dict]:
    """Yield the HellaSwag records of a jsonl file, checking the fields rendering needs."""
    name = name or str(path)
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{name} line {line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise EvalFileError(f"{where}: not valid JSON ({e})") from e
            endings = record.get("endings") if isinstance(record, dict) else None
            if not (
                isinstance(endings, list)
                and isinstance(record.get("ctx"), str)
                and len(endings) == NUM_ENDINGS
                and all(isinstance(e, str) for e in endings)
                and record.get("label") in range(NUM_ENDINGS)
            ):
                raise EvalFileError(
                    f"{where}: expected 'ctx' (string), 'endings' ({NUM_ENDINGS} strings) and 'label' (0-3)"
                )
            yield record


def render_example(record: dict, index: int, enc: tiktoken.Encoding | None = None) -> Example:
    """Tokenize one HellaSwag record completion style: ctx, and " " + each ending."""
    enc = enc or get_gpt2_encoding()
    return Example(
        index=index,
        label=int(record["label"]),
        ctx_tokens=enc.encode_ordinary(record["ctx"]),
        ending_tokens=[enc.encode_ordinary(" " + ending) for ending in record["endings"]],
    )


# ---------------------------------------------------------------------------------------------------------
# eval file


def _example_stream(ex: Example) -> list[int]:
    body = [ex.index, ex.label, len(ex.ending_tokens), len(ex.ctx_tokens), *ex.ctx_tokens]
    for ending in ex.ending_tokens:
        body += [len(ending), *ending]
    example_bytes = 2 * (2 + len(body))  # START_EXAMPLE and example_bytes themselves count too
    return [START_EXAMPLE, example_bytes, *body]


def write_eval_file(path: str | os.PathLike, examples: Sequence[Example]) -> None:
    """Write llm.c's eval file for `examples`, atomically."""
    streams = [_example_stream(ex) for ex in examples]
    for ex, stream in zip(examples, streams):
        fits = len(ex.ending_tokens) == NUM_ENDINGS and 2 * len(stream) < 2**16 and max(stream[2:]) < START_EXAMPLE
        if not fits:
            raise EvalFileError(
                f"{path}: example {ex.index} does not fit the format "
                f"(needs {NUM_ENDINGS} endings, < 64 KiB, values < {START_EXAMPLE})"
            )
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = (MAGIC, VERSION, len(examples), max((2 * len(s) for s in streams), default=0))
    body = np.array([t for s in streams for t in s], dtype="<u2")
    with atomic_path(path) as tmp:
        tmp.write_bytes(header.tobytes() + body.tobytes())


def read_eval_file(path: str | os.PathLike) -> list[Example]:
    """Parse and validate an llm.c eval file."""
    raw = Path(path).read_bytes()
    if len(raw) < HEADER_BYTES:
        raise EvalFileError(f"{path}: shorter than the {HEADER_BYTES}-byte header")
    header = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    if header[0] != MAGIC or header[1] != VERSION:
        raise EvalFileError(f"{path}: header starts {header[0]}, {header[1]}; an eval file starts {MAGIC}, {VERSION}")
    stream = np.frombuffer(raw[HEADER_BYTES:], dtype="<u2").tolist()
    examples, pos = [], 0
    for i in range(int(header[2])):

        def corrupt(what: str) -> EvalFileError:
            return EvalFileError(f"{path}: example {i} {what} (file corrupt or truncated); rewrite it")

        if pos + EXAMPLE_FIELDS + 1 > len(stream) or stream[pos] != START_EXAMPLE:
            raise corrupt(f"does not start with {START_EXAMPLE}")
        end = pos + stream[pos + 1] // 2
        index, label, num_endings, ctx_len = stream[pos + 2 : pos + 6]
        if end > len(stream) or num_endings != NUM_ENDINGS:
            raise corrupt(f"claims {stream[pos + 1]} bytes and {num_endings} endings")
        cursor = pos + 6 + ctx_len
        ctx, endings = stream[pos + 6 : cursor], []
        for _ in range(num_endings):
            if cursor >= end:
                raise corrupt("ends before its last ending")
            n = stream[cursor]
            endings.append(stream[cursor + 1 : cursor + 1 + n])
            cursor += 1 + n
        if cursor != end:
            raise corrupt(f"has {2 * (cursor - pos)} bytes of fields but claims {stream[pos + 1]}")
        examples.append(Example(index=index, label=label, ctx_tokens=ctx, ending_tokens=endings))
        pos = end
    if pos != len(stream):
        raise EvalFileError(f"{path}: {len(stream) - pos} trailing tokens after the {header[2]} examples")
    return examples


def prepare(out_dir: str | os.PathLike, source: str | os.PathLike = HELLASWAG_VAL_URL) -> Path:
    """Download (or copy) the jsonl and write out_dir/hellaswag_val.bin, unless it exists; return its path."""
    out = Path(out_dir) / EVAL_NAME
    if out.exists():
        return out
    jsonl = download(out_dir, source)
    enc = get_gpt2_encoding()
    examples = [render_example(record, i, enc) for i, record in enumerate(iter_jsonl(jsonl))]
    write_eval_file(out, examples)
    return out


# ---------------------------------------------------------------------------------------------------------
# scoring


def example_tensors(ex: Example) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens (4, T) int64 = context + ending, zero padded; mask (4, T) = 1 on the ending's tokens."""
    rows = [ex.ctx_tokens + ending for ending in ex.ending_tokens]
    T = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, (row, ending) in enumerate(zip(rows, ex.ending_tokens)):
        tokens[i, : len(row)] = torch.tensor(row)
        mask[i, len(ex.ctx_tokens) : len(row)] = 1
    return tokens, mask


def _argmin_first(values: list[float]) -> int:
    return min(range(len(values)), key=lambda i: (values[i], i))  # ties: the lowest index


def predict(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[int, int]:
    """(prediction by sum of ending losses, prediction by mean), from logits (4, T, V) for tokens (4, T)."""
    tokens, mask = tokens.to(logits.device), mask.to(logits.device)
    losses = F.cross_entropy(  # loss at position t predicts token t+1
        logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten(), reduction="none"
    ).view(tokens.size(0), -1)  # (4, T-1)
    ending_mask = mask[:, 1:].float()  # (4, T-1)
    sum_loss = (losses * ending_mask).sum(dim=1)
    mean_loss = sum_loss / ending_mask.sum(dim=1)
    return _argmin_first(sum_loss.tolist()), _argmin_first(mean_loss.tolist())


def evaluate(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    eval_path: str | os.PathLike,
    rank: int = 0,
    world_size: int = 1,
    all_reduce: Callable[[list[int]], list[int]] | None = None,
    limit: int | None = None,
    progress: bool = True,
) -> dict:
    """Score HellaSwag with `logits_fn(tokens int64 (4, T) on CPU) -> logits (4, T, V)`, any device.

    Distributed: rank r scores examples i with i % world_size == r. Pass `all_reduce`, a function that sums
    a list of ints over all ranks (e.g. built on torch.distributed.all_reduce), to get global results on
    every rank; without it the counts and accuracies are this rank's share only.
    limit: score only the first `limit` examples of the file.
    Returns {"acc", "acc_norm", "n", "correct", "correct_norm"}.
    """
    examples = read_eval_file(eval_path)[:limit]
    correct = correct_norm = n = 0
    for ex in tqdm(examples[rank::world_size], desc="hellaswag", disable=not progress or rank != 0):
        tokens, mask = example_tensors(ex)
        with torch.no_grad():
            pred, pred_norm = predict(logits_fn(tokens), tokens, mask)
        correct += pred == ex.label
        correct_norm += pred_norm == ex.label
        n += 1
    if all_reduce is not None:
        correct, correct_norm, n = all_reduce([correct, correct_norm, n])
    return {
        "acc": correct / n if n else float("nan"),
        "acc_norm": correct_norm / n if n else float("nan"),
        "n": n,
        "correct": correct,
        "correct_norm": correct_norm,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m data.hellaswag",
        description="Download HellaSwag val and write llm.c's eval file (hellaswag_val.bin).",
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--source", default=HELLASWAG_VAL_URL, help="URL or local jsonl path (default: official val)")
    args = parser.parse_args(argv)
    path = prepare(args.out, args.source)
    examples = read_eval_file(path)
    print(f"{len(examples)} examples in {path}")


if __name__ == "__main__":
    main()
