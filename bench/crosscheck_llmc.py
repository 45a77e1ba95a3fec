"""The long cross-check against llm.c's own trainer: inputs before, comparison after (bench/crosscheck_llmc.sh).

    python -m bench.crosscheck_llmc prepare --work DIR [--shard-size N]
        real text (every .py file of this Python's site-packages, sorted by path) tokenized by data.shards into
        DIR/shards (shard 0 validation, the rest training), and d12's init from seed 42 as an llm.c bfloat16
        model file DIR/init_bf16.bin: the one init both trainers start from.
    python -m bench.crosscheck_llmc compare --llmc LOG --ours METRICS [--noise NAME=LOG_OR_METRICS ...] --out DIR
        per-step train losses side by side (llm.c's console log, our run's metrics.jsonl), the largest difference
        and its step, val losses, tokens/s; each --noise run is compared with the run it repeats (an llm.c log
        with llm.c, a metrics .jsonl with ours) and gives the bf16 noise floor. Writes DIR/losses.csv and
        DIR/summary.json and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sysconfig
from pathlib import Path

LLMC_STEP = re.compile(r"^step\s+(\d+)/\d+ \| loss (\S+) .*\| (\S+) ms \|.*\| (\d+) tok/s")
LLMC_VAL = re.compile(r"^val loss (\S+)")
TIMING_SKIP = 20  # first steps left out of tokens/s: compilation, allocator and cuBLAS warm-up
WINDOWS = (0, 1, 10, 100, 250, 500, 750)  # starts of the step ranges the differences are also given for


def site_packages_files() -> list[Path]:
    return sorted(Path(sysconfig.get_paths()["purelib"]).rglob("*.py"))


def prepare(work: Path, shard_size: int) -> None:
    from data.shards import build_shards
    from gpt2.config import parse_model_spec
    from gpt2.llmc import write_model_file
    from gpt2.model import GPT

    files = site_packages_files()
    texts = (f.read_text(encoding="utf-8", errors="replace") for f in files)
    manifest = build_shards(texts, work / "shards", "sitepackages", shard_size=shard_size,
                            source={"site_packages_py_files": len(files)})
    tokens = sum(s["ntok"] for s in manifest["shards"])
    print(f"{len(files)} .py files -> {tokens:,} tokens in {len(manifest['shards'])} shards of {shard_size:,}")
    write_model_file(GPT.create(parse_model_spec("d12"), seed=42), work / "init_bf16.bin", dtype="bfloat16")
    print(f"init: {work / 'init_bf16.bin'}")


def read_llmc_log(path: Path) -> dict:
    """llm.c's console output: 'step N/M | loss L ... | MS ms | ... | TOK tok/s' (N counts from 1) and 'val loss V'
    (before the first step and after every val_loss_every steps)."""
    train, ms, val = {}, {}, []
    for line in path.read_text().splitlines():
        if m := LLMC_STEP.match(line):
            step = int(m.group(1)) - 1
            train[step], ms[step] = float(m.group(2)), float(m.group(3))
        elif m := LLMC_VAL.match(line):
            val.append((len(train), float(m.group(1))))
    return {"train": train, "ms": ms, "val": dict(val)}


def read_our_run(metrics: Path) -> dict:
    """Our metrics.jsonl: one record per train step (0-based) and per val loss."""
    train, ms, val = {}, {}, {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train":
            train[record["step"]], ms[record["step"]] = record["loss"], record["ms"]
        elif record["kind"] == "val":
            val[record["step"]] = record["val_loss"]
    return {"train": train, "ms": ms, "val": val}


def is_ours(path: Path) -> bool:
    return path.suffix == ".jsonl"


def read_run(path: Path) -> dict:
    return read_our_run(path) if is_ours(path) else read_llmc_log(path)


def tokens_per_s(run: dict, tokens_per_step: int) -> float:
    times = [ms for step, ms in sorted(run["ms"].items()) if step >= TIMING_SKIP]
    return tokens_per_step / (statistics.median(times) / 1e3)


def difference_stats(diffs: dict[int, float]) -> dict:
    worst = max(diffs, key=diffs.get)
    return {"steps": len(diffs), "max_abs": diffs[worst], "at_step": worst, "mean_abs": statistics.fmean(diffs.values()),
            "rms": statistics.fmean(d * d for d in diffs.values()) ** 0.5}


def largest_difference(a: dict, b: dict) -> dict:
    """|train loss a - train loss b| over the steps both have, and over each window of WINDOWS."""
    steps = sorted(set(a["train"]) & set(b["train"]))
    diffs = {s: abs(a["train"][s] - b["train"][s]) for s in steps}
    bounds = [*(w for w in WINDOWS if w < len(steps)), len(steps)]
    windows = {f"{lo}-{hi - 1}": difference_stats({s: diffs[s] for s in steps[lo:hi]})
               for lo, hi in zip(bounds, bounds[1:])}
    return {**difference_stats(diffs), "windows": windows}


def compare(llmc: Path, ours: Path, noise: list[str], out: Path, tokens_per_step: int) -> dict:
    runs = {"llmc": read_run(llmc), "ours": read_run(ours)}
    summary = {"llmc_vs_ours": largest_difference(runs["llmc"], runs["ours"]), "noise": {}}
    for spec in noise:
        name, path = spec.split("=", 1)
        runs[name] = read_run(Path(path))
        reference = "ours" if is_ours(Path(path)) else "llmc"
        summary["noise"][name] = {"against": reference, **largest_difference(runs[reference], runs[name])}
    summary["val"] = {name: run["val"] for name, run in runs.items()}
    summary["tokens_per_s"] = {name: tokens_per_s(run, tokens_per_step) for name, run in runs.items()}

    out.mkdir(parents=True, exist_ok=True)
    steps = sorted(set.intersection(*(set(run["train"]) for run in runs.values())) | set(runs["ours"]["train"]))
    with open(out / "losses.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", *runs])
        for step in steps:
            writer.writerow([step, *(run["train"].get(step, "") for run in runs.values())])
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    pairs = {"llmc vs ours": summary["llmc_vs_ours"],
             **{f"{n['against']} vs {name}": n for name, n in summary["noise"].items()}}
    print("|train loss diff| by steps: max (at step) / mean")
    print(f"{'':>24} | " + " | ".join(f"{w:>18}" for w in ["all", *summary["llmc_vs_ours"]["windows"]]))
    for label, d in pairs.items():
        cells = [d, *d["windows"].values()]
        print(f"{label:>24} | " + " | ".join(f"{c['max_abs']:.3f} ({c['at_step']:>3}) / {c['mean_abs']:.3f}"
                                            for c in cells))
    val_steps = sorted(set().union(*(run["val"] for run in runs.values())))
    print("val loss | " + " | ".join(f"{s:>7}" for s in val_steps))
    for name, run in runs.items():
        print(f"{name:>8} | " + " | ".join(f"{run['val'].get(s, float('nan')):7.4f}" for s in val_steps))
    print("tokens/s | " + " | ".join(f"{name} {tps:,.0f}" for name, tps in summary["tokens_per_s"].items()))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.crosscheck_llmc", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenize site-packages into shards and write the bf16 init")
    p.add_argument("--work", type=Path, required=True, help="folder for shards/ and init_bf16.bin")
    p.add_argument("--shard-size", type=int, default=12_000_000, help="tokens per shard (shard 0: validation)")
    c = sub.add_parser("compare", help="compare llm.c's run with ours, and each noise run with its twin")
    c.add_argument("--llmc", type=Path, required=True, help="llm.c's console log")
    c.add_argument("--ours", type=Path, required=True, help="our run's metrics.jsonl")
    c.add_argument("--noise", action="append", default=[],
                   help="NAME=PATH: a repeat of llm.c's run (its log) or of ours (a metrics .jsonl), changed only in "
                        "ways that change rounding")
    c.add_argument("--tokens-per-step", type=int, default=65536, help="tokens per optimizer step")
    c.add_argument("--out", type=Path, required=True, help="folder for losses.csv and summary.json")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.work, args.shard_size)
    else:
        compare(args.llmc, args.ours, args.noise, args.out, args.tokens_per_step)


if __name__ == "__main__":
    main()
