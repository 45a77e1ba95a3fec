"""Helpers of bench/run_pipeline_gpu.sh: an offline corpus with learnable structure, a HellaSwag-format
file drawn from the same structure, and the run's report (pipeline against gpt2.train alone).

The corpus is a Markov chain over real English words (those of the shipped smoke corpus): each word has
three possible successors with probabilities 0.6, 0.3 and 0.1, and "." ends a sentence. A model can
learn it (the best possible loss is about 0.9 nats per word, well under 1 per token) and never sees the
same long passage twice. HellaSwag-format examples: a context from the chain, the right ending continues
it, the three wrong ones start at random words; a model that learned the chain picks the right one.

    python -m bench.pipeline_gpu corpus --out DIR --tokens N [--workers K]
    python -m bench.pipeline_gpu hellaswag --out FILE --examples N
    python -m bench.pipeline_gpu report --pipeline-run DIR --alone-run DIR --flow-runs JSON --out DIR
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from common.files import atomic_path, write_json
from gpt2.metrics import read_metrics
from gpt2.run_dir import RunDir

REPO = Path(__file__).resolve().parent.parent
WORDS_SOURCE = REPO / "tests" / "fixtures" / "pipeline" / "corpus.jsonl"
SUCCESSOR_PROBS = np.array([0.6, 0.3, 0.1])
SEED = 1234
TOKENS_PER_WORD = 1.3  # GPT-2 tokens per word of this vocabulary with its leading space (measured: 1.34)
DOC_WORDS = 400  # words per document


def vocabulary() -> list[str]:
    """Distinct lowercase words of the smoke corpus, plus "." (ends a sentence)."""
    words = set()
    for line in WORDS_SOURCE.read_text().splitlines():
        words.update(re.findall(r"[a-z]{2,}", json.loads(line)["text"].lower()))
    return sorted(words) + ["."]


def successors(n_words: int) -> np.ndarray:
    """[word, 3] successor ids, fixed by SEED; "." is a successor of every 8th word, so sentences end."""
    rng = np.random.default_rng(SEED)
    table = rng.integers(0, n_words - 1, size=(n_words, 3))
    table[::8, 2] = n_words - 1
    return table


def chains(table: np.ndarray, n: int, length: int, rng: np.random.Generator,
           start: np.ndarray | None = None) -> np.ndarray:
    """[n, length] word ids: n independent walks of the chain (from `start` when given)."""
    out = np.empty((n, length), dtype=np.int64)
    out[:, 0] = rng.integers(0, len(table), size=n) if start is None else start
    for t in range(1, length):
        choice = rng.choice(3, size=n, p=SUCCESSOR_PROBS)
        out[:, t] = table[out[:, t - 1], choice]
    return out


def render(words: list[str], ids: np.ndarray) -> str:
    return " ".join(words[i] for i in ids).replace(" .", ".")


def _write_part(args: tuple[Path, int, int]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path, n_docs, part = args
    words = vocabulary()
    table = successors(len(words))
    rng = np.random.default_rng([SEED, part])
    docs = [render(words, row) for row in chains(table, n_docs, DOC_WORDS, rng)]
    with atomic_path(path) as tmp:
        pq.write_table(pa.table({"text": docs}), tmp)
    return n_docs


def write_corpus(out: Path, tokens: int, workers: int) -> None:
    """Parquet files with a `text` column holding about `tokens` GPT-2 tokens (a little more)."""
    out.mkdir(parents=True, exist_ok=True)
    n_docs = int(tokens / TOKENS_PER_WORD / DOC_WORDS * 1.1) + 1
    parts = max(1, min(64, n_docs // 2000))
    per_part = -(-n_docs // parts)
    jobs = [(out / f"part_{i:05d}.parquet", per_part, i) for i in range(parts)
            if not (out / f"part_{i:05d}.parquet").exists()]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(_write_part, jobs))
    print(f"[corpus] {parts * per_part:,} documents of {DOC_WORDS} words (~{parts * per_part * DOC_WORDS * TOKENS_PER_WORD:,.0f} "
          f"tokens) in {out}")


def write_hellaswag(path: Path, examples: int) -> None:
    """HellaSwag-format jsonl (ctx, 4 endings, label) drawn from the corpus's chain."""
    words = vocabulary()
    table = successors(len(words))
    rng = np.random.default_rng([SEED, 10**6])
    context = chains(table, examples, 12, rng)
    right = chains(table, examples, 7, rng, start=context[:, -1])[:, 1:]
    wrong = [chains(table, examples, 6, rng) for _ in range(3)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(examples):
            label = int(rng.integers(0, 4))
            endings = [render(words, w[i]) for w in wrong]
            endings.insert(label, render(words, right[i]))
            f.write(json.dumps({"ctx": render(words, context[i]), "endings": endings, "label": label}) + "\n")
    print(f"[hellaswag] {examples} examples in {path}")


# ---------------------------------------------------------------------------------------------------------
# report


def _step_times(run_dir: RunDir) -> dict[int, float]:
    """Wall-clock time of each training step's record (TensorBoard keeps one per scalar)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    times = {}
    for path in sorted(run_dir.tensorboard.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            if any(value.tag == "train/tok_s" for value in event.summary.value):
                times[event.step] = event.wall_time
    return times


def _median_tok_s(records: list[dict], skip: int) -> float | None:
    values = [r["tok_s"] for r in records if r.get("kind") == "train" and r["step"] >= skip]
    return statistics.median(values) if values else None


def report(pipeline_run: Path, alone_run: Path | None, flow_runs_path: Path, out: Path, skip: int) -> dict:
    """summary.json: tokens/s through the pipeline and alone, the scheduled evaluations' cost, losses, evals."""
    from datetime import datetime

    pipeline_dir = RunDir(pipeline_run)
    pipeline = read_metrics(pipeline_dir.metrics)
    flow_runs = json.loads(flow_runs_path.read_text()) if flow_runs_path.exists() else []
    summary: dict = {"pipeline_run": str(pipeline_run), "flow_runs": flow_runs}
    summary["pipeline_tokens_per_s"] = _median_tok_s(pipeline, skip)
    if alone_run is not None and (alone_metrics := RunDir(alone_run).metrics).exists():
        summary["alone_tokens_per_s"] = _median_tok_s(read_metrics(alone_metrics), skip)
        if summary["pipeline_tokens_per_s"] and summary["alone_tokens_per_s"]:
            summary["orchestration_overhead"] = 1 - summary["pipeline_tokens_per_s"] / summary["alone_tokens_per_s"]

    # steps that ran while a scheduled evaluation ran, against the others
    windows = [(datetime.fromisoformat(r["start"]).timestamp(), datetime.fromisoformat(r["end"]).timestamp())
               for r in flow_runs if r["flow"] == "gpt2-evaluate" and r.get("start") and r.get("end")]
    times = _step_times(pipeline_dir)
    during, outside = [], []
    for r in pipeline:
        if r.get("kind") == "train" and r["step"] >= skip and r["step"] in times:
            overlaps = any(start <= times[r["step"]] <= end for start, end in windows)
            (during if overlaps else outside).append(r["tok_s"])
    summary["scheduled_evaluation"] = {
        "runs": len(windows), "steps_during": len(during), "steps_outside": len(outside),
        "tokens_per_s_during": statistics.median(during) if during else None,
        "tokens_per_s_outside": statistics.median(outside) if outside else None,
    }
    if during and outside:
        summary["scheduled_evaluation"]["cost"] = 1 - statistics.median(during) / statistics.median(outside)

    train = [r for r in pipeline if r.get("kind") == "train"]
    summary["loss_curve"] = [(r["step"], r["loss"]) for r in train if r["step"] % 10 == 0 or r is train[-1]]
    summary["val_loss"] = [(r["step"], r["val_loss"]) for r in pipeline if r.get("kind") == "val"]
    summary["hellaswag"] = [(r["step"], r.get("acc_norm")) for r in pipeline if r.get("kind") == "hellaswag"]
    summary["evaluations"] = {p.stem: json.loads(p.read_text()) for p in sorted(pipeline_dir.evaluations.glob("*.json"))}
    summary["peak_mem_gb"] = max((r.get("peak_mem_gb") or 0.0 for r in train), default=None)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "summary.json", summary)
    _print_summary(summary)
    return summary


def _print_summary(s: dict) -> None:
    def fmt(value, spec=",.0f"):
        return "n/a" if value is None else format(value, spec)

    print(f"tokens/s through the pipeline: {fmt(s['pipeline_tokens_per_s'])}")
    print(f"tokens/s gpt2.train alone:     {fmt(s.get('alone_tokens_per_s'))}")
    print(f"orchestration overhead:        {fmt(s.get('orchestration_overhead'), '.2%')} (target <= 2%)")
    e = s["scheduled_evaluation"]
    print(f"scheduled evaluations: {e['runs']} runs; tokens/s during {fmt(e['tokens_per_s_during'])} "
          f"({e['steps_during']} steps), outside {fmt(e['tokens_per_s_outside'])} ({e['steps_outside']} steps); "
          f"cost {fmt(e.get('cost'), '.2%')} (target <= 5%)")
    if s["loss_curve"]:
        print(f"train loss: first {s['loss_curve'][0][1]:.3f}, last {s['loss_curve'][-1][1]:.3f}")
    print(f"val loss: {s['val_loss']}")
    print(f"HellaSwag acc_norm during training: {s['hellaswag']}")
    print(f"evaluations: { {k: (v.get('val_loss'), (v.get('hellaswag') or {}).get('acc_norm')) for k, v in s['evaluations'].items()} }")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline_gpu", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    corpus = sub.add_parser("corpus", help="parquet documents with learnable structure")
    corpus.add_argument("--out", type=Path, required=True)
    corpus.add_argument("--tokens", type=int, required=True, help="GPT-2 tokens wanted (a little more is written)")
    corpus.add_argument("--workers", type=int, default=8)
    hs = sub.add_parser("hellaswag", help="a HellaSwag-format jsonl from the same chain")
    hs.add_argument("--out", type=Path, required=True)
    hs.add_argument("--examples", type=int, default=200)
    rep = sub.add_parser("report", help="summary.json of a pipeline run against gpt2.train alone")
    rep.add_argument("--pipeline-run", type=Path, required=True)
    rep.add_argument("--alone-run", type=Path)
    rep.add_argument("--flow-runs", type=Path, required=True, help="JSON list of the server's flow runs")
    rep.add_argument("--out", type=Path, required=True)
    rep.add_argument("--skip", type=int, default=10, help="untimed first steps (compilation, warm-up)")
    args = parser.parse_args(argv)
    if args.command == "corpus":
        write_corpus(args.out, args.tokens, args.workers)
    elif args.command == "hellaswag":
        write_hellaswag(args.out, args.examples)
    else:
        report(args.pipeline_run, args.alone_run, args.flow_runs, args.out, args.skip)


if __name__ == "__main__":
    main()
