"""A short CPU run learns the structure of text from a small grammar: loss falls well below its unigram entropy."""

import math
import random
from collections import Counter

import numpy as np
import pytest

from gpt2.train import train
from tests.fixtures.train.tiny import single_thread  # noqa: F401 (autouse fixture)
from tests.fixtures.train.tiny import read_metrics, tiny_config, write_token_shard

SUBJECTS = ["the cat", "a dog", "my old friend", "the teacher", "a small bird", "her brother"]
VERBS = ["sees", "likes", "chases", "finds", "paints", "remembers"]
OBJECTS = ["the red ball", "a green house", "the river", "an apple", "the moon", "a quiet garden"]
ENDINGS = [" today.", " again.", ".", " every morning."]


def grammar_text(n_sentences: int, seed: int) -> str:
    """Sentences 'subject verb object ending' drawn uniformly: byte-level structure a tiny model can learn."""
    rng = random.Random(seed)
    sentences = (f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}"
                 for _ in range(n_sentences))
    return " ".join(sentences)


def unigram_entropy_nats(data: bytes) -> float:
    counts = Counter(data)
    return -sum(c / len(data) * math.log(c / len(data)) for c in counts.values())


@pytest.mark.slow
def test_loss_falls_well_below_the_unigram_entropy(tmp_path):
    shards = tmp_path / "grammar"
    shards.mkdir()
    train_bytes = grammar_text(4000, seed=0).encode()  # ~130k tokens, one byte each
    val_bytes = grammar_text(300, seed=1).encode()
    write_token_shard(shards / "grammar_val_000000.bin", np.frombuffer(val_bytes, dtype=np.uint8))
    write_token_shard(shards / "grammar_train_000001.bin", np.frombuffer(train_bytes, dtype=np.uint8))
    entropy = unigram_entropy_nats(train_bytes)

    config = tiny_config(
        tmp_path, model="n_layer=2,n_head=4,n_embd=64,block_size=64,vocab_size=256",
        train_data=str(shards / "*_train_*.bin"), val_data=str(shards / "*_val_*.bin"),
        batch_size=16, seq_len=64, total_batch_size=1024, max_steps=150, warmup_steps=10, lr=3e-3,
        weight_decay=0.0, val_every=150, val_steps=4, log_every=50,
    )
    train(config)
    first_loss = read_metrics(config.out_dir)[0]["loss"]
    val_loss = read_metrics(config.out_dir, "val")[-1]["val_loss"]
    # a model that knew only byte frequencies would score the unigram entropy (about 2.9 nats here)
    assert first_loss > entropy  # starts near log(256) = 5.5
    assert val_loss < 0.5 * entropy, f"val loss {val_loss:.3f} vs unigram entropy {entropy:.3f}"
