"""Val loss, the evaluate CLI (any model source), and top-k sampling."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gpt2 import checkpoint as ckpt
from gpt2 import evaluate, sample
from gpt2.distributed import DistContext
from gpt2.llmc import write_model_file
from gpt2.model import GPT
from gpt2.train import train
from gpt2.config import parse_model_spec
from tests.fixtures.train.tiny import single_thread  # noqa: F401 (autouse fixture)
from tests.fixtures.train.tiny import (
    TINY_GPT2_VOCAB_MODEL, TINY_MODEL, make_shards, read_metrics, tiny_config, write_hellaswag_file,
)

CPU = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def test_val_loss_is_the_mean_over_the_first_batches(tmp_path):
    from data.loader import DistributedDataLoader

    _, val_glob = make_shards(tmp_path)
    model = GPT.create(parse_model_spec(TINY_MODEL))
    loader = DistributedDataLoader(val_glob, 2, 16, order="file")
    loader.next_batch()  # evaluation resets the loader: where it stood does not matter
    got = evaluate.val_loss(model, loader, steps=3, ctx=CPU)

    # reference: the shard's first 3 * 32 + 1 tokens read from the file's bytes, cut into (2, 16) batches
    tokens = torch.from_numpy(np.fromfile(tmp_path / "tiny_val_000000.bin", dtype="<u2", offset=1024).astype(np.int64))
    losses = []
    for i in range(3):
        chunk = tokens[i * 32 : i * 32 + 33]
        logits, _ = model(chunk[:-1].view(2, 16))
        losses.append(F.cross_entropy(logits.view(-1, 256), chunk[1:]).item())
    assert got == pytest.approx(sum(losses) / 3, rel=1e-6)
    assert evaluate.val_loss(model, loader, steps=3, ctx=CPU) == got


def test_evaluate_cli_agrees_with_the_training_loop_for_every_source(tmp_path, capsys):
    config = tiny_config(tmp_path, model=TINY_GPT2_VOCAB_MODEL, max_steps=2, val_every=2, val_steps=2)
    train(config)
    in_loop = read_metrics(config.out_dir, "val")[-1]
    hellaswag_file = write_hellaswag_file(tmp_path / "hellaswag.bin")
    latest = ckpt.latest_checkpoint(config.out_dir)
    out = tmp_path / "eval.json"
    args = ["--val-data", config.val_data, "--batch-size", "4", "--seq-len", "16", "--val-steps", "2",
            "--hellaswag", str(hellaswag_file), "--device", "cpu"]

    result = evaluate.main(["--checkpoint", config.out_dir, "--out", str(out), *args])
    assert result["step"] == 2 and in_loop["step"] == 2
    assert result["val_loss"] == pytest.approx(in_loop["val_loss"], rel=1e-6)
    assert json.loads(out.read_text()) == result
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert result["hellaswag"]["n"] == 6 and 0.0 <= result["hellaswag"]["acc_norm"] <= 1.0

    from_llmc = evaluate.main(["--checkpoint", str(latest / ckpt.MODEL_FILE), *args])
    assert from_llmc["step"] is None
    assert from_llmc["val_loss"] == pytest.approx(result["val_loss"], rel=1e-6)
    assert from_llmc["hellaswag"] == result["hellaswag"]


def test_evaluate_cli_needs_something_to_evaluate(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--checkpoint", str(tmp_path)])
    assert e.value.code == 2  # argparse's usage error, before any model is loaded
    assert "nothing to evaluate: pass --val-data and/or --hellaswag" in capsys.readouterr().err


def test_top_1_sampling_is_greedy_decoding():
    model = GPT.create(parse_model_spec(TINY_MODEL))
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    got = sample.generate(model, prompt, max_new_tokens=5, top_k=1)
    expected = prompt
    for _ in range(5):  # reference: argmax of the full-sequence logits, appended one at a time
        logits, _ = model(expected)
        expected = torch.cat([expected, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(got, expected)


def test_top_k_only_draws_from_the_k_most_likely_tokens():
    model = GPT.create(parse_model_spec(TINY_MODEL))
    prompt = torch.tensor([[7, 8, 9]]).repeat(200, 1)
    allowed = torch.topk(model(prompt[:1])[0][0, -1], k=3).indices.tolist()
    drawn = sample.generate(model, prompt, max_new_tokens=1, top_k=3, generator=torch.Generator().manual_seed(0))
    assert set(drawn[:, -1].tolist()) == set(allowed)  # 200 draws hit all 3 and nothing else


def test_sample_cli_reads_an_llmc_file_and_is_reproducible(tmp_path, capsys):
    path = write_model_file(GPT.create(parse_model_spec(TINY_GPT2_VOCAB_MODEL)), tmp_path / "model.bin")
    args = ["--checkpoint", str(path), "--prompt", "Hello, I'm", "--num-samples", "2", "--max-new-tokens", "5",
            "--device", "cpu"]
    first = sample.main(args)
    assert len(first) == 2 and all(text.startswith("Hello, I'm") for text in first)
    assert sample.main(args) == first
    assert sample.main([*args, "--seed", "1"]) != first
    assert "--- sample 1" in capsys.readouterr().out


def test_sample_out_is_written_into_a_folder_that_did_not_exist(tmp_path):
    """`--out` may name a file in a new folder: it is created, and the JSON holds the samples."""
    from common.files import read_json

    path = write_model_file(GPT.create(parse_model_spec(TINY_GPT2_VOCAB_MODEL)), tmp_path / "model.bin")
    out = tmp_path / "new" / "deeper" / "samples.json"
    texts = sample.main(["--checkpoint", str(path), "--prompt", "Hi", "--num-samples", "1", "--max-new-tokens", "2",
                         "--device", "cpu", "--out", str(out)])
    assert read_json(out)["samples"] == texts
