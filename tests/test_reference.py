"""docs/reference.md's flag-by-flag table of llm.c's 124M run against the `gpt2-124m` deployment.

The deployment's parameters are read from prefect.yaml and resolved by the pipeline's own settings code
(flows.config.check_settings, then each training setting's gpt2.train default where the deployment gives
none): every row's value must be what a run of that deployment uses. The llm.c side is checked against
the values below, read off llm.c's scripts/run_gpt2_124M.sh and train_gpt2.cu (commit f1e2ace).
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent

# run_gpt2_124M.sh's flags, and train_gpt2.cu's defaults of those it does not pass (-x, -k, -w, -m)
LLMC_FLAGS = {"-i": "dev/data/fineweb10B/fineweb_train_*.bin", "-j": "dev/data/fineweb10B/fineweb_val_*.bin",
              "-o": "log_gpt2_124M", "-e": "d12", "-b": 64, "-t": 1024, "-d": 524288, "-x": -1, "-l": 0.0006,
              "-u": 700, "-q": 0.0, "-k": "cosine", "-c": 0.1, "-w": 1, "-z": 1, "-r": 0, "-v": 250, "-m": 20,
              "-h": 1, "-s": 20000, "-g": 144, "-n": 5000, "-y": 1}
# values fixed in train_gpt2.cu's code, by the setting of ours they correspond to
LLMC_FIXED = {"seed": 42, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "grad_clip": 1.0, "train_order": 1}
REQUIRED_FLAGS = "-b -t -d -l -u -q -c -z -r -v -m -s -g -h -n -y -e".split()


def table_rows() -> list[dict]:
    """The rows of the table after the `<!-- llmc-flags -->` marker, cells stripped of their backticks."""
    text = (REPO / "docs" / "reference.md").read_text()
    lines = text.split("<!-- llmc-flags -->", 1)[1].strip().splitlines()
    table = lines[: next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header == ["llm.c flag", "what it sets", "llm.c value", "`gpt2-124m` setting", "our value", "same?"]
    rows = []
    for line in table[2:]:
        flag, what, llmc, setting, ours, verdict = (c.strip() for c in line.strip("|").split("|"))
        rows.append({"flag": flag.strip("`"), "what": what, "llmc": llmc.strip("`"), "setting": setting.strip("`"),
                     "ours": ours.strip("`"), "verdict": verdict})
    return rows


@functools.cache
def deployment_settings():
    from flows.config import check_settings

    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    (deployment,) = [d for d in deployments
                     if d["name"] == "gpt2-124m" and d["entrypoint"] == "flows.pipeline:gpt2_pretrain"]
    return check_settings(deployment["parameters"])


def resolved(settings, name: str):
    from flows.config import training_setting_names

    value = settings.training_value(name) if name in training_setting_names() else getattr(settings, name)
    return "auto" if value is None else value  # None: gpt2.train decides per device (its --help says how)


def parsed(cell: str):
    """A cell's value as YAML reads it (numbers, true/false, text); 1/0 and true/false compare equal."""
    value = yaml.safe_load(cell)
    return float(value) if isinstance(value, (bool, int, float)) else value


def test_the_table_covers_every_flag_of_the_124m_run():
    flags = [row["flag"] for row in table_rows()]
    assert set(REQUIRED_FLAGS) | {"(loader)"} <= set(flags), sorted(set(REQUIRED_FLAGS) - set(flags))
    assert len(flags) == len(set(flags) - {"(code)"}) + flags.count("(code)"), "a flag has two rows"


@pytest.mark.parametrize("row", table_rows(), ids=lambda row: f"{row['flag']}-{row['setting']}")
def test_each_row_states_llmcs_value_and_the_deployments(row):
    expected_llmc = LLMC_FLAGS.get(row["flag"], LLMC_FIXED.get(row["setting"]))
    assert expected_llmc is not None, f"{row['flag']} {row['setting']}: no record of llm.c's value"
    assert parsed(row["llmc"]) == parsed(str(expected_llmc)), f"{row['flag']}: llm.c's value is {expected_llmc}"

    if row["setting"] != "—":
        value = resolved(deployment_settings(), row["setting"])
        assert parsed(str(value).lower() if isinstance(value, bool) else str(value)) == parsed(row["ours"]), (
            f"{row['flag']}: the gpt2-124m deployment's {row['setting']} is {value!r}, the table says {row['ours']}")

    kind, _, why = row["verdict"].partition(":")
    assert kind in ("same", "equivalent", "differs"), row["verdict"]
    if kind == "same":
        assert parsed(row["llmc"]) == parsed(row["ours"]), f"{row['flag']}: called the same, but the values differ"
    else:
        assert why.strip(), f"{row['flag']}: say why it is {kind}"
    if kind == "differs" and row["setting"] != "—":
        assert parsed(row["llmc"]) != parsed(row["ours"]), f"{row['flag']}: called different, but the values agree"



def unpacked(folder: Path, out: Path) -> Path:
    """`folder`'s raw outputs, gzip-compressed in git to keep bench/results small, written out uncompressed."""
    out.mkdir(parents=True)
    for packed in folder.glob("*.gz"):
        (out / packed.stem).write_bytes(gzip.decompress(packed.read_bytes()))
    return out


def test_the_cross_check_figures_are_those_of_the_committed_runs(tmp_path):
    """docs/reference.md's cross-check tables, recomputed from the raw outputs under bench/results by the
    script that made them: ours at today's defaults (master weights) with three noise runs, and ours before
    master weights with its noise run, each against the same llm.c run."""
    from bench.crosscheck_llmc import WINDOWS, compare

    results = REPO / "bench" / "results" / "2026-11-24"
    now, before = (unpacked(results / name, tmp_path / "raw" / name)
                   for name in ("crosscheck-llmc-h100-master-weights", "crosscheck-llmc-h100"))
    llmc = before / "llmc.log"
    summary = compare(llmc, now / "ours.metrics.jsonl",
                      [f"llmc_ge2={before / 'llmc_ge2.log'}", f"llmc_seed={now / 'llmc_seed.log'}",
                       f"ours_nokernels={now / 'ours_nokernels.metrics.jsonl'}"], tmp_path / "now", tokens_per_step=65536)
    earlier = compare(llmc, before / "ours.metrics.jsonl",
                      [f"ours_nokernels={before / 'ours_nokernels.metrics.jsonl'}"], tmp_path / "before",
                      tokens_per_step=65536)
    text = (REPO / "docs" / "reference.md").read_text()

    def cells(stats: dict) -> str:  # step 0 alone has no "at step"; a shorter run's missing ranges are "—"
        windows = list(stats["windows"].values())
        first = f"{windows[0]['max_abs']:.3f} / {windows[0]['mean_abs']:.3f}"
        rest = [f"{w['max_abs']:.3f} ({w['at_step']}) / {w['mean_abs']:.3f}" for w in windows[1:]]
        rest += ["—"] * (len(WINDOWS) - len(windows))
        return " | ".join([first, *rest, f"{stats['max_abs']:.3f} ({stats['at_step']}) / {stats['mean_abs']:.3f}"])

    def val_row(name: str, values: dict) -> str:
        return f"| {name} | " + " | ".join(f"{values[s]:.4f}" if s in values else "—"
                                           for s in (0, 250, 300, 500, 750, 1000)) + " |"

    noise = summary["noise"]
    assert f"| llm.c vs ours | {cells(summary['llmc_vs_ours'])} |" in text
    assert f"| noise: llm.c vs llm.c `-ge 2` | {cells(noise['llmc_ge2'])} |" in text
    assert f"| noise: llm.c vs llm.c, another rounding seed | {cells(noise['llmc_seed'])} |" in text
    assert f"| noise: ours vs ours `--no-kernels` | {cells(noise['ours_nokernels'])} |" in text
    assert f"| llm.c vs ours without master weights | {cells(earlier['llmc_vs_ours'])} |" in text
    assert (f"| noise: ours vs ours `--no-kernels`, both without master weights | "
            f"{cells(earlier['noise']['ours_nokernels'])} |") in text
    assert val_row("llm.c `train_gpt2cu`", summary["val"]["llmc"]) in text
    assert val_row("ours, `gpt2.train` defaults", summary["val"]["ours"]) in text
    assert val_row("llm.c `-ge 2` (noise)", summary["val"]["llmc_ge2"]) in text
    assert val_row("llm.c, another rounding seed (noise)", summary["val"]["llmc_seed"]) in text
    assert val_row("ours `--no-kernels` (noise)", summary["val"]["ours_nokernels"]) in text
    assert val_row("ours without master weights", earlier["val"]["ours"]) in text
    assert val_row("ours without master weights, `--no-kernels` (noise)", earlier["val"]["ours_nokernels"]) in text
    tokens, tokens_before = summary["tokens_per_s"], earlier["tokens_per_s"]
    assert f"llm.c {tokens['llmc']:,.0f}" in text and f"ours {tokens['ours']:,.0f}" in text
    assert f"without\nmaster weights {tokens_before['ours']:,.0f}" in text
