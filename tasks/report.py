"""What people look at: the loss-curve PNG of a run and the markdown that sets a run beside the references."""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path
from typing import Any

from common.files import atomic_path

# Reference points (docs/reference.md): llm.c's GPT-2 124M after 10B FineWeb tokens, OpenAI's GPT-2 124M.
REFERENCE_VAL_LOSS = 3.28
REFERENCE_TOKENS = 10e9
OPENAI_HELLASWAG_ACC_NORM = 0.2955
OPENAI_VAL_LOSS = 3.42
TOKENS_PER_S_WINDOW = 20  # tokens/s and MFU are averaged over the last steps (the first ones compile)
CURVE_WIDTH = 640  # pixels of the loss curve inlined in the summary markdown


def training_figures(metrics: list[dict[str, Any]]) -> dict[str, float | None]:
    """Final train/val loss and steady-state tokens/s and MFU from metrics.jsonl records."""
    train = [m for m in metrics if m.get("kind") == "train"]
    val = [m for m in metrics if m.get("kind") == "val" and m.get("val_loss") is not None]
    steady = train[1:][-TOKENS_PER_S_WINDOW:] or train  # skip step 0: compilation and warm-up

    def mean(key: str) -> float | None:
        values = [m[key] for m in steady if m.get(key) is not None]
        return sum(values) / len(values) if values else None

    return {
        "train_loss": train[-1]["loss"] if train else None,
        "val_loss": val[-1]["val_loss"] if val else None,
        "tokens_per_s": mean("tok_s"),
        "mfu": mean("mfu"),
    }


def loss_curve_figure(metrics: list[dict[str, Any]], run_name: str) -> "matplotlib.figure.Figure":
    """Train and val loss against step, titled with the run's name, with llm.c's 10B-token val loss dashed; the
    y-axis spans the run's losses (a short run's 10.8 -> 10.45 is not flattened by the reference at 3.28)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training hosts
    import matplotlib.pyplot as plt

    train = [(m["step"], m["loss"]) for m in metrics if m.get("kind") == "train" and m.get("loss") is not None]
    val = [(m["step"], m["val_loss"]) for m in metrics if m.get("kind") == "val" and m.get("val_loss") is not None]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if train:
        ax.plot(*zip(*train), label="train loss", linewidth=1)
    if val:
        ax.plot(*zip(*val), "o-", label="val loss", markersize=3)
    reference = f"llm.c 124M after 10B tokens ({REFERENCE_VAL_LOSS})"
    losses = [loss for _, loss in train + val]
    if losses:  # the run's losses fill the axis; a reference far below (a short run) is named, not drawn to
        low, high = min(losses), max(losses)
        margin = max(0.05 * (high - low), 0.01)
        ax.set_ylim(low - margin, high + margin)
        if REFERENCE_VAL_LOSS < low - margin:
            reference += ", below this axis"
    ax.axhline(REFERENCE_VAL_LOSS, color="gray", linestyle="--", label=reference)
    ax.set_title(f"Loss of {run_name}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def plot_loss_curve(metrics: list[dict[str, Any]], path: str | os.PathLike, run_name: str) -> Path:
    """`loss_curve_figure` as a PNG (the title also in its Title field), written atomically."""
    import matplotlib.pyplot as plt

    fig = loss_curve_figure(metrics, run_name)
    path = Path(path)
    try:
        with atomic_path(path) as tmp:  # the temporary name ends in .tmp: give savefig the format
            fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight", metadata={"Title": fig.axes[0].get_title()})
    finally:
        plt.close(fig)
    return path


def png_data_uri(path: str | os.PathLike, max_width: int = CURVE_WIDTH) -> str:
    """A PNG as a `data:` URI, downsampled to `max_width` and to a 64-colour palette (a few tens of KB).

    The Prefect UI renders markdown artifacts in the browser, which will not open the `file://` link of a
    file on the worker's disk; an image inlined this way shows wherever the artifact is viewed (Prefect
    3.8's default UI lets `data:image/` sources through its markdown sanitizer on purpose, the classic UI
    passes them as they are).
    """
    from PIL import Image, PngImagePlugin

    with Image.open(path) as image:
        title = image.text.get("Title")
        image = image.convert("RGB")
    if image.width > max_width:
        image = image.resize((max_width, round(image.height * max_width / image.width)), Image.LANCZOS)
    info = PngImagePlugin.PngInfo()
    if title:
        info.add_text("Title", title)
    buffer = io.BytesIO()
    image.quantize(colors=64).save(buffer, format="PNG", optimize=True, pnginfo=info)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def run_summary_markdown(
    title: str,
    run_dir: str,
    steps: int,
    tokens: int,
    figures: dict[str, float | None],
    hellaswag_acc_norm: float | None,
    loss_curve: str | None,
) -> str:
    """A run's headline numbers next to the reference points, so one sees at a glance how far it got."""
    progress = tokens / REFERENCE_TOKENS
    val = figures.get("val_loss")
    lines = [
        f"# {title}",
        "",
        f"Run directory: `{run_dir}` (TensorBoard: `tensorboard --logdir {run_dir}/tensorboard`)",
        "",
        "| metric | this run | reference |",
        "| --- | --- | --- |",
        f"| steps / tokens | {steps:,} / {tokens:,} ({100 * progress:.4g} % of 10B) | 18,865 / 10B (llm.c 124M) |",
        f"| final train loss | {_fmt(figures.get('train_loss'), '.4f')} | |",
        f"| val loss (FineWeb) | {_fmt(val, '.4f')} | ≈ {REFERENCE_VAL_LOSS} llm.c after 10B tokens; "
        f"≈ {OPENAI_VAL_LOSS} OpenAI GPT-2 124M |",
        f"| HellaSwag acc_norm | {_fmt(hellaswag_acc_norm, '.4f')} | {OPENAI_HELLASWAG_ACC_NORM} OpenAI GPT-2 124M; "
        "≈ 0.30 llm.c after 10B |",
        f"| tokens/s | {_fmt(figures.get('tokens_per_s'), ',.0f')} | ≈ 475,000 PyTorch+compile on 1 H100; target 590,000 |",
        f"| MFU | {_fmt(None if figures.get('mfu') is None else 100 * figures['mfu'], '.1f')} % | |",
    ]
    if val is not None:
        gap = val - REFERENCE_VAL_LOSS
        lines += ["", f"Val loss is {gap:+.3f} from the 10B-token reference."]
    if loss_curve and Path(loss_curve).is_file():
        lines += ["", f"![loss curve]({png_data_uri(loss_curve)})", "", f"Full size: `{loss_curve}`"]
    elif loss_curve:  # e.g. deleted after a cached training record was written
        lines += ["", f"Loss curve: `{loss_curve}` is missing."]
    return "\n".join(lines) + "\n"
