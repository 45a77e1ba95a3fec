"""DistributedDataLoader: llm.c rank slicing, shard advance, batch orders, exact resume, validation (llm.c's exact
order is checked against its own loader in test_data_llmc_order.py)."""

import json

import numpy as np
import pytest
import torch

from data.loader import DistributedDataLoader
from data.shards import ShardError, write_shard


@pytest.fixture
def two_shards(tmp_path):
    """Shard 0 holds tokens 0..24 (25 tokens), shard 1 holds 100..130 (31): token value = position + base."""
    write_shard(tmp_path / "t_val_000000.bin", np.arange(25))
    write_shard(tmp_path / "t_train_000001.bin", np.arange(100, 131))
    return tmp_path


def batches(loader, n):
    return [tuple(t.tolist() for t in loader.next_batch()) for _ in range(n)]


def test_rank_slices_by_hand(two_shards):
    # B=2, T=3, P=2: a step covers P*B*T = 12 tokens. Shard 0 (25 tokens) holds (25-1)//12 = 2 steps,
    # shard 1 (31 tokens) holds (31-1)//12 = 2 steps; then the loader wraps to shard 0.
    # Sample i of rank r starts at (i*P + r)*B*T = 12i + 6r and spans B*T+1 = 7 tokens.
    expected = {
        0: [
            ([[0, 1, 2], [3, 4, 5]], [[1, 2, 3], [4, 5, 6]]),  # shard 0, start 0
            ([[12, 13, 14], [15, 16, 17]], [[13, 14, 15], [16, 17, 18]]),  # shard 0, start 12
            ([[100, 101, 102], [103, 104, 105]], [[101, 102, 103], [104, 105, 106]]),  # shard 1, start 0
            ([[112, 113, 114], [115, 116, 117]], [[113, 114, 115], [116, 117, 118]]),  # shard 1, start 12
            ([[0, 1, 2], [3, 4, 5]], [[1, 2, 3], [4, 5, 6]]),  # epoch 1
        ],
        1: [
            ([[6, 7, 8], [9, 10, 11]], [[7, 8, 9], [10, 11, 12]]),  # shard 0, start 6
            ([[18, 19, 20], [21, 22, 23]], [[19, 20, 21], [22, 23, 24]]),  # shard 0, start 18: last token 24
            ([[106, 107, 108], [109, 110, 111]], [[107, 108, 109], [110, 111, 112]]),  # shard 1, start 6
            ([[118, 119, 120], [121, 122, 123]], [[119, 120, 121], [122, 123, 124]]),  # shard 1, start 18
            ([[6, 7, 8], [9, 10, 11]], [[7, 8, 9], [10, 11, 12]]),  # epoch 1
        ],
    }
    for rank in (0, 1):
        loader = DistributedDataLoader(str(two_shards / "t_*.bin"), B=2, T=3, process_rank=rank, num_processes=2)
        assert [p.name for p in loader.files] == ["t_train_000001.bin", "t_val_000000.bin"]  # sorted glob
        loader = DistributedDataLoader(
            [two_shards / "t_val_000000.bin", two_shards / "t_train_000001.bin"], B=2, T=3, process_rank=rank,
            num_processes=2, order="file",
        )
        assert batches(loader, 5) == expected[rank]


def test_batches_are_int64_tensors_of_shape_B_T(two_shards):
    x, y = DistributedDataLoader(str(two_shards / "t_val_*.bin"), B=2, T=3).next_batch()
    assert x.shape == y.shape == (2, 3)
    assert x.dtype == y.dtype == torch.int64


def test_reset_starts_over(two_shards):
    loader = DistributedDataLoader(str(two_shards / "t_*.bin"), B=2, T=3)
    first = batches(loader, 3)
    loader.reset()
    assert batches(loader, 3) == first


def sample_starts(loader, n):
    """(shard file, first token) of the next n batches; token value identifies the position in its shard."""
    out = []
    for _ in range(n):
        shard = loader.files[loader.shard_idx].name
        x, _ = loader.next_batch()
        out.append((shard, int(x[0, 0])))
    return out


@pytest.fixture
def many_shards(tmp_path):
    for i in range(4):  # 4 shards of 4 samples each for B*T = 4, one process: (17 - 1) // 4 = 4
        write_shard(tmp_path / f"s_train_{i:06d}.bin", np.arange(17) + 1000 * i)
    return str(tmp_path / "s_*.bin")


def test_llmc_order_visits_every_sample_once_per_epoch_in_a_seeded_order(many_shards):
    every_sample = sorted((f"s_train_{i:06d}.bin", 1000 * i + 4 * s) for i in range(4) for s in range(4))
    loader = DistributedDataLoader(many_shards, B=1, T=4, seed=7)
    epoch0, epoch1 = sample_starts(loader, 16), sample_starts(loader, 16)
    assert sorted(epoch0) == sorted(epoch1) == every_sample
    assert epoch0 != epoch1 and epoch0 != every_sample  # reshuffled every epoch, not the file order
    # shards are visited one at a time: 4 runs of 4 samples from one shard
    assert [len({shard for shard, _ in epoch0[i : i + 4]}) for i in range(0, 16, 4)] == [1, 1, 1, 1]

    same_seed = DistributedDataLoader(many_shards, B=1, T=4, seed=7)
    assert sample_starts(same_seed, 16) == epoch0
    # two ranks (B*T = 2, so rank r's sample s starts at token 4s + 2r) shuffle differently
    orders = []
    for rank in (0, 1):
        loader = DistributedDataLoader(many_shards, B=1, T=2, process_rank=rank, num_processes=2, seed=7)
        orders.append([(shard, (token % 1000 - 2 * rank) // 4) for shard, token in sample_starts(loader, 16)])
    assert sorted(orders[0]) == sorted(orders[1]) and orders[0] != orders[1]


@pytest.mark.parametrize("order", ["file", "llmc"])
def test_state_dict_resumes_with_the_exact_next_batch(many_shards, order):
    loader = DistributedDataLoader(many_shards, B=1, T=4, order=order, seed=3)
    for consumed in (0, 3, 4, 15, 16, 21):  # start, mid-shard, shard boundary, epoch boundary, epoch 1
        loader.reset()
        batches(loader, consumed)
        state = json.loads(json.dumps(loader.state_dict()))  # must survive a checkpoint round trip
        expected = batches(loader, 10)
        resumed = DistributedDataLoader(many_shards, B=1, T=4, order=order, seed=3)
        resumed.load_state_dict(state)
        assert batches(resumed, 10) == expected, consumed


def test_state_from_other_settings_is_refused(many_shards):
    state = DistributedDataLoader(many_shards, B=1, T=4, seed=3).state_dict()
    with pytest.raises(ValueError, match="saved with other seed"):
        DistributedDataLoader(many_shards, B=1, T=4, seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match="shard_pos 4 is not a position of these 4 shards"):
        DistributedDataLoader(many_shards, B=1, T=4, seed=3).load_state_dict({**state, "shard_pos": 4})


def test_bad_shards_are_named(tmp_path):
    write_shard(tmp_path / "small.bin", np.arange(6))
    with pytest.raises(ShardError, match=r"small\.bin: 6 tokens, fewer than one step of num_processes\*B\*T\+1 = 13"):
        DistributedDataLoader([tmp_path / "small.bin"], B=2, T=3, num_processes=2)
    write_shard(tmp_path / "cut.bin", np.arange(100))
    (tmp_path / "cut.bin").write_bytes((tmp_path / "cut.bin").read_bytes()[:-10])
    with pytest.raises(ShardError, match=r"cut\.bin: header says 100 tokens"):
        DistributedDataLoader([tmp_path / "cut.bin"], B=2, T=3)
    with pytest.raises(ShardError, match="no shards match"):
        DistributedDataLoader(str(tmp_path / "nothing_*.bin"), B=2, T=3)
    with pytest.raises(ValueError, match="process_rank must lie in"):
        DistributedDataLoader(str(tmp_path / "cut.bin"), B=2, T=3, process_rank=2, num_processes=2)
    with pytest.raises(ValueError, match="order must be one of llmc, file, got 'shuffled'"):
        DistributedDataLoader(str(tmp_path / "cut.bin"), B=2, T=3, order="shuffled")
