"""HellaSwag: rendering, llm.c eval file bytes, and scoring with a fake model whose losses we set."""

import json
import math
import struct
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from data.hellaswag import (
    EvalFileError, Example, batch_tensors, download, ending_losses, evaluate, iter_jsonl, prepare, read_eval_file,
    render_example, write_eval_file,
)
from data.tokenizer import get_gpt2_encoding
from gpt2.config import GPTConfig
from gpt2.model import GPT

FIXTURE = Path(__file__).parent / "fixtures" / "data" / "hellaswag_mini.jsonl"


def test_render_is_completion_style():
    enc = get_gpt2_encoding()  # tiktoken's "gpt2", its cache seeded offline
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
    """logits (rows, T, V) whose cross-entropy at position t against tokens[:, t+1] is LOSS[tokens[:, t+1]]."""
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


@pytest.mark.parametrize("examples_per_batch", [1, 3, 16])  # one per call, a partial last batch, all in one
def test_scores_by_hand(hand_eval_file, examples_per_batch):
    result = evaluate(fake_logits, hand_eval_file, examples_per_batch=examples_per_batch, progress=False)
    assert result == {"acc": 0.5, "acc_norm": 1.0, "n": 4, "correct": 2, "correct_norm": 4}
    assert evaluate(fake_logits, hand_eval_file, limit=1, progress=False)["acc_norm"] == 1.0


def test_batch_rows_are_right_padded_with_ending_masks():
    tokens, mask = batch_tensors(HAND_EXAMPLES[2:])
    # example 2 (ctx [2, 1]) then example 3 (ctx [1]); the longest row is [1] + [4] * 6, 7 tokens
    rows = [[2, 1, 6], [2, 1, 5], [2, 1, 4, 4], [2, 1, 4, 4], [1, 5, 5], [1, 6], [1, 6, 5], [1, 4, 4, 4, 4, 4, 4]]
    ctx_lens = [2] * 4 + [1] * 4
    assert tokens.tolist() == [row + [0] * (7 - len(row)) for row in rows]
    assert mask.tolist() == [[c <= t < len(row) for t in range(7)] for row, c in zip(rows, ctx_lens)]


def test_ranks_split_examples_and_all_reduce_combines(hand_eval_file):
    rank0 = evaluate(fake_logits, hand_eval_file, rank=0, world_size=2, progress=False)  # examples 0, 2
    rank1 = evaluate(fake_logits, hand_eval_file, rank=1, world_size=2, progress=False)  # examples 1, 3
    assert (rank0["correct"], rank0["correct_norm"], rank0["n"]) == (1, 2, 2)
    assert (rank1["correct"], rank1["correct_norm"], rank1["n"]) == (1, 2, 2)

    def all_reduce(counts):  # what a 2-rank all-reduce would return on rank 0
        return [a + b for a, b in zip(counts, [rank1["correct"], rank1["correct_norm"], rank1["n"]])]

    combined = evaluate(fake_logits, hand_eval_file, rank=0, world_size=2, all_reduce=all_reduce, progress=False)
    assert combined == evaluate(fake_logits, hand_eval_file, progress=False)


@pytest.mark.parametrize("world_size", [2, 3])
def test_batched_ranks_add_up_to_the_hand_scores(hand_eval_file, world_size):
    totals = [0, 0, 0]
    for rank in range(world_size):
        batched = evaluate(fake_logits, hand_eval_file, rank=rank, world_size=world_size, examples_per_batch=3,
                           progress=False)
        one_by_one = evaluate(fake_logits, hand_eval_file, rank=rank, world_size=world_size, examples_per_batch=1,
                              progress=False)
        assert batched == one_by_one
        totals = [a + b for a, b in zip(totals, (batched["correct"], batched["correct_norm"], batched["n"]))]
    assert totals == [2, 4, 4]


def test_a_rank_with_no_examples_writes_no_score_with_its_reason_not_nan(hand_eval_file, tmp_path):
    """Before: {"acc": NaN, "acc_norm": NaN, "n": 0}, which write_json wrote into a file no JSON reader must accept."""
    from common.files import read_json, write_json

    result = evaluate(fake_logits, hand_eval_file, rank=4, world_size=5, progress=False)  # 4 examples, 5 ranks
    assert result == {"acc": None, "acc_norm": None, "n": 0, "correct": 0, "correct_norm": 0,
                      "no_score": "no examples scored (0 of the eval file's)"}
    write_json(tmp_path / "score.json", result)
    assert json.loads((tmp_path / "score.json").read_text(), parse_constant=pytest.fail) == result


def test_bad_batch_size_is_refused(hand_eval_file):
    with pytest.raises(ValueError, match="examples_per_batch must be at least 1, got 0"):
        evaluate(fake_logits, hand_eval_file, examples_per_batch=0, progress=False)


# A tiny real GPT: padding is right, masks are right and rows do not leak into each other only if the
# batched losses equal those of each row run alone, unpadded.
TINY_GPT = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=256, padded_vocab_size=256)


def random_examples(n: int, seed: int = 0) -> list[Example]:
    """Examples of different context and ending lengths (rows of 3 to 26 tokens)."""
    gen = torch.Generator().manual_seed(seed)

    def tokens(lo: int, hi: int) -> list[int]:
        return torch.randint(0, 256, (int(torch.randint(lo, hi, (1,), generator=gen)),), generator=gen).tolist()

    return [Example(index=i, label=i % 4, ctx_tokens=tokens(2, 15), ending_tokens=[tokens(1, 12) for _ in range(4)])
            for i in range(n)]


def row_alone_losses(model: GPT, ex: Example) -> list[tuple[float, float]]:
    """(sum, mean) of each ending's token losses, each row run by itself with no padding."""
    out = []
    for ending in ex.ending_tokens:
        row = torch.tensor([ex.ctx_tokens + ending])
        logits, _ = model(row[:, :-1])
        losses = F.cross_entropy(logits[0, len(ex.ctx_tokens) - 1 :], row[0, len(ex.ctx_tokens) :], reduction="none")
        out.append((losses.sum().item(), losses.mean().item()))
    return out


def test_tiny_gpt_batched_equals_rows_alone(tmp_path):
    model = GPT.create(TINY_GPT, seed=1).eval()
    examples = random_examples(7)
    path = tmp_path / "random.bin"
    write_eval_file(path, examples)

    with torch.no_grad():
        reference = [row_alone_losses(model, ex) for ex in examples]
        tokens, mask = batch_tensors(examples)
        sum_loss, mean_loss = ending_losses(model(tokens)[0], tokens, mask)
    assert sum_loss.tolist() == pytest.approx([s for ex in reference for s, _ in ex], rel=1e-5)
    assert mean_loss.tolist() == pytest.approx([m for ex in reference for _, m in ex], rel=1e-5)

    def first_min(values: list[float]) -> int:
        return min(range(4), key=lambda i: (values[i], i))

    def expected(rank: int, world_size: int) -> tuple[int, int, int]:
        mine = range(rank, len(examples), world_size)
        correct = sum(first_min([s for s, _ in reference[i]]) == examples[i].label for i in mine)
        correct_norm = sum(first_min([m for _, m in reference[i]]) == examples[i].label for i in mine)
        return correct, correct_norm, len(mine)

    assert 0 < expected(0, 1)[1] < 7  # a meaningful fixture: some right, some wrong

    shapes = []  # what logits_fn was given, call by call

    def logits_fn(tokens: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(tokens.shape))
        return model(tokens)[0]

    for examples_per_batch, rank, world_size in [(1, 0, 1), (3, 0, 1), (16, 0, 1), (2, 1, 2), (2, 0, 3)]:
        shapes.clear()
        with torch.no_grad():
            got = evaluate(logits_fn, path, rank=rank, world_size=world_size, examples_per_batch=examples_per_batch,
                           progress=False)
        assert (got["correct"], got["correct_norm"], got["n"]) == expected(rank, world_size)
        mine = examples[rank::world_size]
        batches = [mine[i : i + examples_per_batch] for i in range(0, len(mine), examples_per_batch)]
        assert shapes == [(4 * len(b), max(len(ex.ctx_tokens) + len(e) for ex in b for e in ex.ending_tokens))
                          for b in batches]


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_an_eval_source_with_no_examples_is_refused_naming_it(tmp_path, text):
    """Before: accepted, and every later HellaSwag score was NaN of n 0."""
    from data.hellaswag import EmptyEvalSource

    source = tmp_path / "empty.jsonl"
    source.write_text(text)
    with pytest.raises(EmptyEvalSource, match=rf"^{source} holds no HellaSwag examples: nothing to score"):
        prepare(tmp_path / "out", source)
    assert not (tmp_path / "out" / "hellaswag_val.bin").exists()


def test_an_eval_folder_of_no_examples_left_by_an_earlier_version_is_not_kept(tmp_path):
    """Before the refusal, an empty source gave a complete-looking folder (an eval file of 0 examples, its
    manifest); kept as it was, training would meet it only at its first HellaSwag evaluation."""
    from common.files import sha256_file, write_json
    from data.hellaswag import EmptyEvalSource

    source, out = tmp_path / "empty.jsonl", tmp_path / "out"
    source.write_text("")
    out.mkdir()
    (out / "hellaswag_val.jsonl").write_text("")
    write_eval_file(out / "hellaswag_val.bin", [])
    files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(out.iterdir())}
    write_json(out / "manifest.json", {"source": str(source), "source_sha256": sha256_file(source),
                                       "num_examples": 0, "files": files})
    with pytest.raises(EmptyEvalSource, match=rf"^{source} holds no HellaSwag examples"):
        prepare(out, source)


def test_invalid_utf8_in_an_eval_source_names_the_file_line_and_byte_offset(tmp_path):
    """Before: `UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 68`, naming no file."""
    source = tmp_path / "h.jsonl"
    good = FIXTURE.read_bytes().splitlines(keepends=True)[:2]
    bad = b'{"ctx": "a \xff", "endings": ["b", "c", "d", "e"], "label": 0}\n'
    source.write_bytes(b"".join(good) + bad)
    offset = sum(map(len, good)) + bad.index(b"\xff")
    with pytest.raises(EvalFileError, match=rf"^{source} line 3: not UTF-8 text: byte 0xff at byte offset "
                                            rf"{offset:,} of the file \(invalid start byte\)"):
        prepare(tmp_path / "out", source)


def test_an_eval_file_with_no_examples_or_a_label_past_its_endings_is_refused_naming_it(tmp_path):
    """Before: an eval file of 0 examples scored NaN; one whose label is 7 scored it wrong, every time."""
    from data.hellaswag import EmptyEvalSource

    path = tmp_path / "hellaswag_val.bin"
    write_eval_file(path, [])
    with pytest.raises(EmptyEvalSource, match=rf"^{path}: its header counts 0 examples: nothing to score"):
        read_eval_file(path)
    write_eval_file(path, [HAND_EXAMPLES[0], Example(index=1, label=7, ctx_tokens=[1], ending_tokens=[[3]] * 4)])
    with pytest.raises(EvalFileError, match=rf"^{path}: example 1 has label 7, not one of its 4 endings \(0-3\)"):
        read_eval_file(path)
