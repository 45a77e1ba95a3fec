"""Tokenize+shard throughput: data.shards.build_shards vs a straightforward baseline, same process, same corpus.

The baseline is what llm.c's dev/data/fineweb.py does: one process pool, `pool.imap` over documents
(chunksize 16), each worker returns `np.array([EOT] + encode_ordinary(doc)).astype(uint16)`, the main
process appends to a numpy buffer and writes shards. Both read the same local parquet corpus, use the same
number of worker processes, and must write byte-identical shards. "Per core" is tokens per CPU-second,
counting the main process and its workers, which stays meaningful on a machine shared with other jobs.
Starting the workers costs a fixed ~0.5 CPU-s each (imports, building the encoding); it is measured on its
own and also reported subtracted, which is what long runs approach.

The corpus is generated (no network): Zipf-distributed words (GPT-2's whole-word tokens, then a long
tail of rare compounds that take several tokens), with sentence case, punctuation, numbers and paragraphs.

    python bench/bench_tokenize.py --docs 20000 --workers 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tiktoken

from data.fineweb import iter_documents
from data.shards import build_shards_from_source, shard_filename
from data.tokenizer import EOT, get_gpt2_encoding


def generate_corpus(out_dir: Path, num_docs: int, seed: int = 0, num_types: int = 500_000) -> Path:
    """Write num_docs documents (mean ~1,000 tokens) to out_dir/corpus.parquet.

    Words follow Zipf's law (exponent 1.2) over num_types word types: GPT-2's single-token lowercase words
    in BPE merge order (roughly frequency order), then a long tail of rare two-word compounds.
    """
    enc = get_gpt2_encoding()
    spaced_words = (enc.decode_single_token_bytes(t) for t in range(enc.n_vocab - 1))  # all but EOT
    common = [w[1:].decode() for w in spaced_words if w[:1] == b" " and w[1:].isalpha() and w[1:].islower()]
    rng = np.random.default_rng(seed)
    pairs = rng.integers(len(common), size=(num_types - len(common), 2))
    types = common + [common[a] + common[b] for a, b in pairs.tolist()]
    zipf_cdf = np.cumsum(1.0 / np.arange(1, num_types + 1) ** 1.2)
    zipf_cdf /= zipf_cdf[-1]
    docs = []
    for _ in range(num_docs):
        n_words = int(rng.lognormal(6.3, 0.8)) + 5
        picks = [types[i] for i in np.searchsorted(zipf_cdf, rng.random(n_words)).tolist()]
        for j in np.flatnonzero(rng.random(n_words) < 0.03):  # numbers: years, counts, prices
            picks[j] = str(int(rng.lognormal(4, 2.5)))
        sentences, start = [], 0
        while start < n_words:
            end = start + int(rng.integers(6, 25))
            sentence = " ".join(picks[start:end])
            sentences.append(sentence[:1].upper() + sentence[1:] + rng.choice([".", ".", ".", "?", "!", ","]))
            start = end
        paragraphs = [" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5)]
        docs.append("\n\n".join(paragraphs))
    path = out_dir / "corpus.parquet"
    pq.write_table(pa.table({"text": docs}), path)
    return path


_enc: tiktoken.Encoding | None = None


def _baseline_init() -> None:
    global _enc
    _enc = get_gpt2_encoding()


def _baseline_tokenize(doc: str) -> np.ndarray:
    tokens = [EOT]
    tokens.extend(_enc.encode_ordinary(doc))
    return np.array(tokens).astype(np.uint16)


def baseline_build(corpus: Path, out_dir: Path, name: str, shard_size: int, workers: int) -> int:
    """llm.c's fineweb.py loop. Returns the number of tokens written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    buf, fill, idx, total = np.empty(shard_size, dtype=np.uint16), 0, 0, 0

    def write(n: int) -> None:  # llm.c's write_datafile
        header = np.zeros(256, dtype=np.int32)
        header[:3] = (20240520, 1, n)
        with open(out_dir / shard_filename(name, idx), "wb") as f:
            f.write(header.tobytes() + buf[:n].tobytes())

    with multiprocessing.get_context("spawn").Pool(workers, initializer=_baseline_init) as pool:
        for tokens in pool.imap(_baseline_tokenize, iter_documents(corpus), chunksize=16):
            total += len(tokens)
            while len(tokens):
                n = min(len(tokens), shard_size - fill)
                buf[fill : fill + n], fill, tokens = tokens[:n], fill + n, tokens[n:]
                if fill == shard_size:
                    write(fill)
                    idx, fill = idx + 1, 0
    if fill:
        write(fill)
    return total


def start_pool(workers: int) -> None:
    """Start and stop a pool like both implementations do: the fixed cost of spawning workers."""
    with multiprocessing.get_context("spawn").Pool(workers, initializer=get_gpt2_encoding) as pool:
        pool.map(abs, range(workers))


def measure(fn) -> dict:
    """Wall time and CPU time (this process plus its finished worker processes) of fn()."""
    def cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    wall0, cpu0 = time.perf_counter(), cpu()
    result = fn()
    return {"result": result, "wall_s": time.perf_counter() - wall0, "cpu_s": cpu() - cpu0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=20_000, help="documents in the generated corpus")
    parser.add_argument("--workers", type=int, default=2, help="worker processes for both implementations")
    parser.add_argument("--shard-size", type=int, default=10**7, help="tokens per shard")
    parser.add_argument("--workdir", type=Path, default=None, help="where to put corpus and shards (default: a temp dir)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        corpus = generate_corpus(work, args.docs)
        print(f"corpus: {args.docs} documents, {corpus.stat().st_size / 1e6:.1f} MB parquet")

        startup = measure(lambda: start_pool(args.workers))
        base = measure(lambda: baseline_build(corpus, work / "baseline", "b", args.shard_size, args.workers))
        ours = measure(
            lambda: build_shards_from_source(corpus, work / "ours", "b", shard_size=args.shard_size, num_workers=args.workers)
        )
        manifest = ours.pop("result")
        ntok = base.pop("result")
        for record in manifest["shards"]:
            if (work / "baseline" / record["file"]).read_bytes() != (work / "ours" / record["file"]).read_bytes():
                raise SystemExit(f"{record['file']} differs between baseline and build_shards")
        assert manifest["num_tokens"] == ntok

    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {multiprocessing.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f}",
        "workers": args.workers,
        "documents": args.docs,
        "tokens": ntok,
    }
    for label, run in (("baseline", base), ("build_shards", ours)):
        result[f"{label}_wall_s"] = round(run["wall_s"], 2)
        result[f"{label}_cpu_s"] = round(run["cpu_s"], 2)
        result[f"{label}_tok_per_cpu_s"] = round(ntok / run["cpu_s"])
    result["worker_startup_cpu_s"] = round(startup["cpu_s"], 2)
    result["speedup_per_core"] = round(base["cpu_s"] / ours["cpu_s"], 2)
    # what a long run approaches: the same comparison without the fixed cost of starting the workers
    result["speedup_per_core_without_startup"] = round(
        (base["cpu_s"] - startup["cpu_s"]) / (ours["cpu_s"] - startup["cpu_s"]), 2
    )
    result["speedup_wall"] = round(base["wall_s"] / ours["wall_s"], 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
