"""HellaSwag: download, completion-style rendering, llm.c's eval file, and a distributable scorer.

Rendering (as llm.c's dev/data/hellaswag.py): the context is `encode(ctx)`, each of the 4 endings is
`encode(" " + ending)`; the model sees context + ending. Scoring: the loss at position t predicts token
t+1; for each ending, take the sum and the mean of the losses over the ending's tokens. The prediction for
`acc` is the ending with the lowest sum, for `acc_norm` the lowest mean; ties go to the lowest index.

Eval file (llm.c, magic 20240522): a header of 256 int32 `[0]=20240522, [1]=1, [2]=n_examples,
[3]=longest example in bytes`, then per example a uint16 stream `65535, example_bytes, index, label, 4,
ctx_len, ctx..., then 4 x (ending_len, ending...)`, where example_bytes counts the whole example.

Text is text: context and endings are encoded with `encode_ordinary`, so an ending containing
`<|endoftext|>` is scored as those characters (never as token 50256); llm.c's script, which uses `encode`,
stops with an error on such an ending, and on every file it accepts the output is identical.

CLI: `python -m data.hellaswag --out DIR [--source PATH_OR_URL]` writes DIR/hellaswag_val.jsonl,
DIR/hellaswag_val.bin and DIR/manifest.json (source identity, sizes and sha256s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import tiktoken
from tqdm import tqdm

from common.cli import run_cli
from common.files import atomic_path, iter_jsonl_records, read_json, sha256_file, write_json
from common.paths import listed_file
from data.tokenizer import VOCAB_SIZE, get_gpt2_encoding

if TYPE_CHECKING:  # the scoring below imports torch where it runs: preparing the file needs none (the
    import torch   # pipeline's flow process, which reads and writes these files, never imports it)

HELLASWAG_VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
JSONL_NAME = "hellaswag_val.jsonl"
EVAL_NAME = "hellaswag_val.bin"
MANIFEST = "manifest.json"  # source identity + size and sha256 of the jsonl copy and the eval file
MAGIC = 20240522
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
START_EXAMPLE = 2**16 - 1
NUM_ENDINGS = 4
EXAMPLE_FIELDS = 5  # START_EXAMPLE, example_bytes, index, label, number of endings


class EvalFileError(ValueError):
    """A HellaSwag jsonl or eval file is malformed; the message names the file and the example."""


class EmptyEvalSource(EvalFileError):
    """A HellaSwag jsonl or eval file with no examples: a score of nothing is no score; the message names it."""


@dataclass(frozen=True)
class Example:
    index: int  # position in the source jsonl
    label: int  # index of the correct ending
    ctx_tokens: list[int]
    ending_tokens: list[list[int]]  # NUM_ENDINGS lists


# ---------------------------------------------------------------------------------------------------------
# source jsonl


def _is_url(source: str | os.PathLike) -> bool:
    """An http(s) URL; anything else is a local path (so a missing file is "not found", never a URL error)."""
    return urllib.parse.urlparse(str(source)).scheme in ("http", "https")


def download(dest: str | os.PathLike, source: str | os.PathLike = HELLASWAG_VAL_URL, timeout_s: float = 60) -> Path:
    """Put the HellaSwag val jsonl at dest/hellaswag_val.jsonl, validated, and return its path.

    source: an http(s) URL to download (default: the official val split) or a local jsonl file to copy;
    a local file that does not exist is a FileNotFoundError naming it.
    """
    out = Path(dest) / JSONL_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    if not _is_url(source) and not Path(source).is_file():
        raise FileNotFoundError(
            f"{source}: no such file (looked for {Path(source).absolute()}); the HellaSwag source is a local "
            f"jsonl file or an http(s) URL"
        )
    with atomic_path(out) as tmp:
        if _is_url(source):
            with urllib.request.urlopen(str(source), timeout=timeout_s) as response, open(tmp, "wb") as f:
                shutil.copyfileobj(response, f)
        else:
            shutil.copyfile(source, tmp)
        for _ in iter_jsonl(tmp, name=str(source)):  # validate before it gets the final name
            pass
    return out


def iter_jsonl(path: str | os.PathLike, name: str | None = None) -> Iterator[dict]:
    """Yield the HellaSwag records of a jsonl file, checking the fields rendering needs; a file without any is
    EmptyEvalSource."""
    examples = 0
    for where, record in iter_jsonl_records(path, EvalFileError, name):
        endings = record.get("endings") if isinstance(record, dict) else None
        if not (
            isinstance(endings, list)
            and isinstance(record.get("ctx"), str)
            and len(endings) == NUM_ENDINGS
            and all(isinstance(e, str) for e in endings)
        ):
            raise EvalFileError(
                f"{where}: expected 'ctx' (string), 'endings' ({NUM_ENDINGS} strings) and 'label' (0-3)"
            )
        label = record.get("label")
        # type(...) is int: JSON's true and 1.0 compare equal to 1 but are not labels
        if type(label) is not int or not 0 <= label < NUM_ENDINGS:
            raise EvalFileError(f"{where}: 'label' is {json.dumps(label)}, expected an integer 0-{NUM_ENDINGS - 1}")
        examples += 1
        yield record
    if not examples:
        raise EmptyEvalSource(f"{name or path} holds no HellaSwag examples: nothing to score; point hellaswag_source "
                              "at a jsonl file with examples in it, or set it to null for no HellaSwag")


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
    data = header.tobytes() + body.tobytes()
    with atomic_path(path, size=len(data)) as tmp:
        tmp.write_bytes(data)


def _corrupt(path: str | os.PathLike, i: int, what: str) -> EvalFileError:
    return EvalFileError(f"{path}: example {i} {what} (file corrupt or truncated); rewrite it")


def read_eval_file(path: str | os.PathLike) -> list[Example]:
    """Parse and validate an llm.c eval file."""
    raw = Path(path).read_bytes()
    if len(raw) < HEADER_BYTES:
        raise EvalFileError(f"{path}: shorter than the {HEADER_BYTES}-byte header")
    header = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    if header[0] != MAGIC or header[1] != VERSION:
        raise EvalFileError(f"{path}: header starts {header[0]}, {header[1]}; an eval file starts {MAGIC}, {VERSION}")
    if header[2] < 1:
        raise EmptyEvalSource(f"{path}: its header counts {header[2]} examples: nothing to score; write it again "
                              "from a HellaSwag jsonl with examples in it (python -m data.hellaswag)")
    stream = np.frombuffer(raw[HEADER_BYTES:], dtype="<u2").tolist()
    examples, pos = [], 0
    for i in range(int(header[2])):
        ctx_start = pos + EXAMPLE_FIELDS + 1  # after the fixed fields and ctx_len
        if ctx_start > len(stream) or stream[pos] != START_EXAMPLE:
            raise _corrupt(path, i, f"does not start with {START_EXAMPLE}")
        end = pos + stream[pos + 1] // 2
        index, label, num_endings, ctx_len = stream[pos + 2 : ctx_start]
        if end > len(stream) or num_endings != NUM_ENDINGS:
            raise _corrupt(path, i, f"claims {stream[pos + 1]} bytes and {num_endings} endings")
        if label >= NUM_ENDINGS:
            raise _corrupt(path, i, f"has label {label}, not one of its {NUM_ENDINGS} endings (0-{NUM_ENDINGS - 1})")
        cursor = ctx_start + ctx_len
        ctx, endings = stream[ctx_start:cursor], []
        for _ in range(num_endings):
            if cursor >= end:
                raise _corrupt(path, i, "ends before its last ending")
            n = stream[cursor]
            endings.append(stream[cursor + 1 : cursor + 1 + n])
            cursor += 1 + n
        if cursor != end:
            raise _corrupt(path, i, f"has {2 * (cursor - pos)} bytes of fields but claims {stream[pos + 1]}")
        if (largest := max((t for tokens in (ctx, *endings) for t in tokens), default=0)) >= VOCAB_SIZE:
            raise _corrupt(path, i, f"holds token {largest}, outside GPT-2's vocabulary of {VOCAB_SIZE}")
        examples.append(Example(index=index, label=label, ctx_tokens=ctx, ending_tokens=endings))
        pos = end
    if pos != len(stream):
        raise EvalFileError(f"{path}: {len(stream) - pos} trailing tokens after the {header[2]} examples")
    return examples


def _source_sha256(source: str | os.PathLike, recorded: dict) -> str | None:
    """The identity of a source's bytes without downloading: a local file's sha256; for a URL, the sha256
    recorded when that same URL was downloaded (a URL is taken to name fixed content), else None."""
    if not _is_url(source):
        return sha256_file(source) if Path(source).is_file() else None
    return recorded.get("source_sha256") if recorded.get("source") == str(source) else None


def _intact(out_dir: Path, manifest: dict) -> bool:
    """Every file the manifest lists is there with its recorded size and sha256."""
    for name, recorded in manifest["files"].items():
        path = listed_file(out_dir, name, out_dir / MANIFEST)
        if not path.is_file() or path.stat().st_size != recorded["size"] or sha256_file(path) != recorded["sha256"]:
            return False
    return True


def prepare(out_dir: str | os.PathLike, source: str | os.PathLike = HELLASWAG_VAL_URL) -> Path:
    """The eval file out_dir/hellaswag_val.bin of `source` (URL or local jsonl); return its path.

    out_dir/manifest.json (written last) records the source, the sha256 of its bytes, and the size and
    sha256 of the jsonl copy and the eval file. An eval file is kept only if its manifest names a source
    with the same bytes and both files verify; anything else (another source, an edited one, a damaged
    file) is downloaded/copied and written again.
    """
    out_dir = Path(out_dir)
    out = out_dir / EVAL_NAME
    manifest_path = out_dir / MANIFEST
    recorded = read_json(manifest_path) if manifest_path.exists() else {}
    source_sha256 = _source_sha256(source, recorded)
    # a folder of no examples (written before they were refused) is never kept: its source is refused again
    if recorded.get("num_examples") and source_sha256 == recorded["source_sha256"] and _intact(out_dir, recorded):
        return out
    manifest_path.unlink(missing_ok=True)
    jsonl = download(out_dir, source)
    enc = get_gpt2_encoding()
    examples = [render_example(record, i, enc) for i, record in enumerate(iter_jsonl(jsonl, name=str(source)))]
    write_eval_file(out, examples)
    files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in (jsonl, out)}
    write_json(manifest_path, {"source": str(source), "source_sha256": files[JSONL_NAME]["sha256"],
                               "num_examples": len(examples), "files": files})
    return out


# ---------------------------------------------------------------------------------------------------------
# scoring


def batch_tensors(examples: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack the examples' rows (context + ending, 4 per example, in order), right-padded with zeros.

    Returns tokens (4n, T) int64 and mask (4n, T) bool, True on the ending's tokens, where T is the
    longest row. Padding goes at the end, so under causal attention it never changes an earlier position.
    """
    import torch

    rows = [(ex.ctx_tokens + ending, len(ex.ctx_tokens)) for ex in examples for ending in ex.ending_tokens]
    T = max(len(row) for row, _ in rows)
    tokens = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, (row, ctx_len) in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row)
        mask[i, ctx_len : len(row)] = True
    return tokens, mask


def ending_losses(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum and mean of each row's ending-token losses, (rows,) each, on the logits' device.

    logits (rows, T, V) for tokens and mask (rows, T) from `batch_tensors`. Only the ending positions are
    converted to fp32 and scored, so no fp32 copy of the whole batch's logits is made.
    """
    import torch
    import torch.nn.functional as F

    scored = mask[:, 1:].to(logits.device)  # (rows, T-1): the loss at position t predicts token t+1
    targets = tokens[:, 1:].to(logits.device)[scored]  # (N,) every row's ending tokens, row by row
    token_losses = torch.zeros(scored.shape, device=logits.device)  # (rows, T-1), zero off the endings
    token_losses[scored] = F.cross_entropy(logits[:, :-1][scored].float(), targets, reduction="none")
    sum_loss = token_losses.sum(dim=1)
    return sum_loss, sum_loss / scored.sum(dim=1)


def predict(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each example's predicted ending by lowest sum and by lowest mean loss, (n,) each, from (4n, ...) rows."""
    sum_loss, mean_loss = ending_losses(logits, tokens, mask)
    # (n, 4) per example; argmin returns the first of equal minima, so ties go to the lowest index
    return sum_loss.view(-1, NUM_ENDINGS).argmin(dim=1), mean_loss.view(-1, NUM_ENDINGS).argmin(dim=1)


def evaluate(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    eval_path: str | os.PathLike,
    rank: int = 0,
    world_size: int = 1,
    all_reduce: Callable[[list[int]], list[int]] | None = None,
    limit: int | None = None,
    examples_per_batch: int = 16,
    progress: bool = True,
) -> dict:
    """Score HellaSwag with `logits_fn(tokens int64 (rows, T) on CPU) -> logits (rows, T, V)`, any device.

    Each call scores `examples_per_batch` examples at once (the last batch may be smaller): their 4 rows
    each, stacked and right-padded to the batch's longest row (`batch_tensors`); 16 examples = 64 rows,
    as llm.c batches. Results do not depend on the batching (beyond float rounding: a model's logits for
    a row may differ in the last bits with the padded length).
    Distributed: rank r scores examples i with i % world_size == r. Pass `all_reduce`, a function that sums
    a list of ints over all ranks (e.g. built on torch.distributed.all_reduce), to get global results on
    every rank; without it the counts and accuracies are this rank's share only.
    limit: score only the first `limit` examples of the file.
    Returns {"acc", "acc_norm", "n", "correct", "correct_norm"}; where no example was scored (`limit` 0, or a
    rank's share without `all_reduce` on a file with fewer examples than ranks), acc and acc_norm are None and
    "no_score" says why (JSON has no NaN to write).
    """
    if examples_per_batch < 1:
        raise ValueError(f"examples_per_batch must be at least 1, got {examples_per_batch}")
    import torch

    examples = read_eval_file(eval_path)[:limit][rank::world_size]
    correct = correct_norm = 0
    show = progress and rank == 0
    # disable=None: off where stderr is not a terminal (a worker's log would fill with carriage returns)
    with tqdm(total=len(examples), desc="hellaswag", unit="example", disable=None if show else True) as bar:
        for start in range(0, len(examples), examples_per_batch):
            batch = examples[start : start + examples_per_batch]
            tokens, mask = batch_tensors(batch)
            with torch.no_grad():
                pred, pred_norm = predict(logits_fn(tokens), tokens, mask)
            labels = torch.tensor([ex.label for ex in batch], device=pred.device)
            correct += int((pred == labels).sum())
            correct_norm += int((pred_norm == labels).sum())
            bar.update(len(batch))
    n = len(examples)
    if all_reduce is not None:
        correct, correct_norm, n = all_reduce([correct, correct_norm, n])
    counts = {"n": n, "correct": correct, "correct_norm": correct_norm}
    if not n:
        return {"acc": None, "acc_norm": None, **counts, "no_score": "no examples scored (0 of the eval file's)"}
    return {"acc": correct / n, "acc_norm": correct_norm / n, **counts}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m data.hellaswag",
        description="Download HellaSwag val and write llm.c's eval file (hellaswag_val.bin); a rerun keeps "
        "the file only if the source's bytes are the same and the files verify.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--source", default=HELLASWAG_VAL_URL, help="http(s) URL or local jsonl path")
    args = parser.parse_args(argv)
    path = prepare(args.out, args.source)
    examples = read_eval_file(path)
    print(f"{len(examples)} examples in {path}")


if __name__ == "__main__":
    run_cli(main)
