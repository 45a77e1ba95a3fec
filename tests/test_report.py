"""The loss curve: titled with the run's name, and embedded in the summary markdown so the Prefect UI shows it."""

import base64
import io
import re

from PIL import Image

from tasks.report import loss_curve_figure, plot_loss_curve, run_summary_markdown

RUN = "smoke/3fa2b1c9d0e1"
METRICS = [
    {"step": 0, "kind": "val", "val_loss": 11.0},
    *({"step": s, "kind": "train", "loss": 11.0 - 0.01 * s} for s in range(300)),
    *({"step": s, "kind": "val", "val_loss": 10.9 - 0.01 * s} for s in range(50, 300, 50)),
]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_figure_title_names_the_run():
    import matplotlib.pyplot as plt

    fig = loss_curve_figure(METRICS, RUN)
    try:
        assert RUN in fig.axes[0].get_title()
        train, val = fig.axes[0].get_lines()[:2]
        assert list(train.get_ydata()[:2]) == [11.0, 10.99]  # the curve plots the records
        assert list(val.get_xdata()) == [0, 50, 100, 150, 200, 250]
    finally:
        plt.close(fig)


def test_png_carries_the_title(tmp_path):
    path = plot_loss_curve(METRICS, tmp_path / "loss_curve.png", RUN)
    image = Image.open(path)
    assert image.format == "PNG"
    assert RUN in image.text["Title"]  # the PNG's own title field, next to the one drawn in the figure


def _embedded_png(markdown: str) -> bytes:
    match = re.search(r"!\[[^\]]*\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", markdown)
    assert match, "no data:image/png image in the markdown"
    return base64.b64decode(match.group(1), validate=True)


def test_summary_markdown_embeds_a_small_decodable_png_of_the_curve(tmp_path):
    curve = plot_loss_curve(METRICS, tmp_path / "loss_curve.png", RUN)
    markdown = run_summary_markdown(f"Training run {RUN}", str(tmp_path), 300, 300 * 524288,
                                    {"val_loss": 8.0}, 0.25, str(curve))
    png = _embedded_png(markdown)
    assert png.startswith(PNG_SIGNATURE)
    image = Image.open(io.BytesIO(png))
    image.load()  # decodes every pixel: a truncated or corrupt PNG raises here
    assert RUN in image.text["Title"]
    assert 300 <= image.width <= 640  # downsampled, still readable
    assert len(png) < 60_000
    assert "file://" not in markdown  # a link the UI cannot open
    assert str(curve) in markdown  # the full-size file is still named


def test_summary_markdown_without_a_curve_has_no_image(tmp_path):
    markdown = run_summary_markdown("Training run x", str(tmp_path), 0, 0, {}, None, None)
    assert "data:image" not in markdown


def test_summary_markdown_says_when_the_curve_file_is_gone(tmp_path):
    # a cached training record can outlive its loss_curve.png: the summary says so instead of failing
    gone = tmp_path / "loss_curve.png"
    markdown = run_summary_markdown("Training run x", str(tmp_path), 0, 0, {}, None, str(gone))
    assert "data:image" not in markdown
    assert f"`{gone}` is missing" in markdown


def test_a_short_run_fills_the_y_axis_and_the_reference_below_it_is_named():
    """A short run's 10.8 -> 10.45 is the whole plot, not a flat line at the top of a 3..11 axis; the 3.28
    reference, off the axis, stays in the legend saying so."""
    import matplotlib.pyplot as plt

    short = [{"step": s, "kind": "train", "loss": 10.8 - 0.35 * s / 24} for s in range(25)]
    fig = loss_curve_figure(short, RUN)
    try:
        low, high = fig.axes[0].get_ylim()
        assert 10.3 < low < 10.45 and 10.8 < high < 10.95, (low, high)
        legend = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
        assert any("3.28" in text and "below" in text for text in legend), legend
    finally:
        plt.close(fig)
