"""HellaSwag: rendering, llm.c eval file bytes, and scoring with a fake model whose losses we set."""

import json
import math
import struct
from pathlib import Path

import pytest
import tiktoken
import torch

from data.hellaswag import EvalFileError, Example, download, evaluate, iter_jsonl, prepare, read_eval_file, render_example, write_eval_file

FIXTURE = Path(__file__).parent / "fixtures" / "data" / "hellaswag_mini.jsonl"


def test_render_is_completion_style():
    enc = tiktoken.get_encoding("gpt2")
    records = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    for i, record in enumerate(records):
        ex = render_example(record, i)
        assert ex.index == i and ex.label == record["label"]
        assert ex.ctx_tokens == enc.encode(record["ctx"])
        assert ex.ending_tokens == [enc.encode(" " + ending) for ending in record["endings"]]
    assert render_example({"ctx": "Hello", "endings": ["world"] * 4, "label": 0}, 0).ending_tokens[0] == [995]


def test_eval_file_bytes_match_llmc_layout(tmp_path):
    examples = [
        Example(index=0, label=1, ctx_tokens=[1, 2], ending_tokens=[[3], [4, 4, 4], [5], [6, 6]]),
        Example(index=1, label=3, ctx_tokens=[7], ending_tokens=[[8], [9], [10], [11, 12]]),
    ]
    # per example: 65535, bytes, index, label, 4, ctx_len, ctx..., 4 x (len, tokens...)
    stream0 = [65535, 38, 0, 1, 4, 2, 1, 2, 1, 3, 3, 4, 4, 4, 1, 5, 2, 6, 6]  # 19 words = 38 bytes
    stream1 = [65535, 32, 1, 3, 4, 1, 7, 1, 8, 1, 9, 1, 10, 2, 11, 12]  # 16 words = 32 bytes
    header = struct.pack("<256i", 20240522, 1, 2, 38, *([0] * 252))
    expected = header + struct.pack(f"<{len(stream0) + len(stream1)}H", *stream0, *stream1)

    path = tmp_path / "eval.bin"
    write_eval_file(path, examples)
    assert path.read_bytes() == expected
    assert read_eval_file(path) == examples


def test_corrupt_eval_files_are_named(tmp_path):
    path = tmp_path / "eval.bin"
    write_eval_file(path, [Example(index=0, label=0, ctx_tokens=[1], ending_tokens=[[2], [3], [4], [5]])])
    good = path.read_bytes()
    path.write_bytes(good[:-2])
    with pytest.raises(EvalFileError, match=r"eval\.bin: example 0"):
        read_eval_file(path)
    path.write_bytes(good + b"\x00\x00")
    with pytest.raises(EvalFileError, match="trailing"):
        read_eval_file(path)
    path.write_bytes(struct.pack("<256i", 20240520, 1, 0, *([0] * 253)))
    with pytest.raises(EvalFileError, match="header starts 20240520"):
        read_eval_file(path)


def test_download_from_local_path_and_prepare(tmp_path):
    jsonl = download(tmp_path, source=FIXTURE)
    assert jsonl.read_text() == FIXTURE.read_text()
    eval_path = prepare(tmp_path, source=FIXTURE)
    records = list(iter_jsonl(FIXTURE))
    assert read_eval_file(eval_path) == [render_example(r, i) for i, r in enumerate(records)]

    bad = tmp_path / "bad.jsonl"
    bad.write_text(FIXTURE.read_text().splitlines()[0] + "\n" + '{"ctx": "x", "endings": ["a"], "label": 0}\n')
    with pytest.raises(EvalFileError, match=r"bad\.jsonl line 2: expected 'ctx'"):
        download(tmp_path / "other", source=bad)
    bad.write_text("[1, 2]\n")
    with pytest.raises(EvalFileError, match=r"bad\.jsonl line 1: expected 'ctx'"):
        download(tmp_path / "other", source=bad)
    assert not (tmp_path / "other" / "hellaswag_val.jsonl").exists()  # nothing half-valid left behind


# The fake model: the loss of predicting token v is LOSS[v], whatever the context. Context tokens
# cost 10 each so that counting them by mistake would change every answer.
V = 16
LOSS = {1: 10.0, 2: 10.0, 3: 1.0, 4: 0.5, 5: 3.0, 6: 2.0}


def fake_logits(tokens: torch.Tensor) -> torch.Tensor:
    """logits (4, T, V) whose cross-entropy at position t against tokens[:, t+1] is LOSS[tokens[:, t+1]]."""
    rows, T = tokens.shape
    logits = torch.zeros(rows, T, V, dtype=torch.float64)  # the last position predicts nothing
    for i in range(rows):
        for t in range(T - 1):
            target = int(tokens[i, t + 1])
            p = math.exp(-LOSS.get(target, 5.0))
            logits[i, t] = math.log((1 - p) / (V - 1))
            logits[i, t, target] = math.log(p)
    return logits


# ending losses (sum, mean) worked out by hand from LOSS:
HAND_EXAMPLES = [
    # [3]: (1, 1)  [4,4,4]: (1.5, .5)  [5]: (3, 3)  [6,6]: (4, 2) -> sum picks 0 (wrong), mean picks 1 (right)
    Example(index=0, label=1, ctx_tokens=[1, 2], ending_tokens=[[3], [4, 4, 4], [5], [6, 6]]),
    # [3]: (1, 1)  [3,3]: (2, 1)  [3]: (1, 1)  [5]: (3, 3) -> sum ties 0 and 2, mean ties 0, 1, 2: both pick 0 (right)
    Example(index=1, label=0, ctx_tokens=[1], ending_tokens=[[3], [3, 3], [3], [5]]),
    # [6]: (2, 2)  [5]: (3, 3)  [4,4]: (1, .5) twice -> both tie 2 and 3 and pick 2 (right)
    Example(index=2, label=2, ctx_tokens=[2, 1], ending_tokens=[[6], [5], [4, 4], [4, 4]]),
    # [5,5]: (6, 3)  [6]: (2, 2)  [6,5]: (5, 2.5)  [4]*6: (3, .5) -> sum picks 1 (wrong), mean picks 3 (right)
    Example(index=3, label=3, ctx_tokens=[1], ending_tokens=[[5, 5], [6], [6, 5], [4] * 6]),
]


@pytest.fixture
def hand_eval_file(tmp_path):
    path = tmp_path / "hand.bin"
    write_eval_file(path, HAND_EXAMPLES)
    return path


def test_scores_by_hand(hand_eval_file):
    result = evaluate(fake_logits, hand_eval_file, progress=False)
    assert result == {"acc": 0.5, "acc_norm": 1.0, "n": 4, "correct": 2, "correct_norm": 4}
    assert evaluate(fake_logits, hand_eval_file, limit=1, progress=False)["acc_norm"] == 1.0


def test_ranks_split_examples_and_all_reduce_combines(hand_eval_file):
    rank0 = evaluate(fake_logits, hand_eval_file, rank=0, world_size=2, progress=False)  # examples 0, 2
    rank1 = evaluate(fake_logits, hand_eval_file, rank=1, world_size=2, progress=False)  # examples 1, 3
    assert (rank0["correct"], rank0["correct_norm"], rank0["n"]) == (1, 2, 2)
    assert (rank1["correct"], rank1["correct_norm"], rank1["n"]) == (1, 2, 2)

    def all_reduce(counts):  # what a 2-rank all-reduce would return on rank 0
        return [a + b for a, b in zip(counts, [rank1["correct"], rank1["correct_norm"], rank1["n"]])]

    combined = evaluate(fake_logits, hand_eval_file, rank=0, world_size=2, all_reduce=all_reduce, progress=False)
    assert combined == evaluate(fake_logits, hand_eval_file, progress=False)
