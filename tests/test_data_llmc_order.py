"""The training loader's default order is llm.c's, batch for batch, checked against llm.c's own loader.

tests/fixtures/data/llmc_loader.json records what llm.c's `DataLoader` (llmc/dataloader.h at the commit the
file names, compiled with a small C driver) served for a few layouts: uneven shard sizes, odd B and T, 1 to
4 processes, several epochs, a single shard, and the unpermuted order (permute=0) for one layout. Each layout's
shards hold consecutive token values across all shards (shard k starts where shard k-1 ends), so a token's
value is its position in the data. For every process and step the file gives the first input token and
sum((i + 1) * token_i) over the B*T + 1 tokens llm.c read (inputs, then the last target).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from data.llmc_rng import Mt19937
from data.loader import DistributedDataLoader
from data.shards import write_shard

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "data" / "llmc_loader.json").read_text())
LAYOUTS = FIXTURE["layouts"]


def layout_id(layout: dict) -> str:
    return (f"B{layout['B']}-T{layout['T']}-P{layout['P']}-{len(layout['shard_tokens'])}shards"
            f"-{'permuted' if layout['permute'] else 'file-order'}")


def write_layout_shards(folder: Path, layout: dict) -> tuple[str, np.ndarray]:
    """The layout's shards, as the fixture's driver wrote them; returns their glob and all tokens in file order."""
    tokens = np.arange(sum(layout["shard_tokens"]))
    bounds = np.cumsum([0, *layout["shard_tokens"]])
    for i in range(len(layout["shard_tokens"])):
        write_shard(folder / f"llmc_train_{i:06d}.bin", tokens[bounds[i] : bounds[i + 1]])
    return str(folder / "llmc_train_*.bin"), tokens


def served(loader: DistributedDataLoader, all_tokens: np.ndarray, steps: int) -> list[list[int]]:
    """(first input token, position-weighted token sum) of the next `steps` batches, checking on the way that
    each batch is B*T + 1 consecutive tokens of one shard, x and y shifted by one."""
    out = []
    for _ in range(steps):
        x, y = loader.next_batch()
        buffer = np.concatenate([x.flatten().numpy(), y.flatten()[-1:].numpy()])
        first = int(buffer[0])
        np.testing.assert_array_equal(buffer, all_tokens[first : first + buffer.size])
        np.testing.assert_array_equal(y.flatten().numpy(), buffer[1:])
        out.append([first, int((np.arange(1, buffer.size + 1, dtype=np.uint64) * buffer.astype(np.uint64)).sum())])
    return out


def order_of(layout: dict) -> str:
    return "llmc" if layout["permute"] else "file"


@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_every_rank_serves_what_llmc_serves(tmp_path, layout):
    pattern, tokens = write_layout_shards(tmp_path, layout)
    for rank in range(layout["P"]):
        if layout["permute"]:  # the default: what gpt2.train's train loader is built with
            loader = DistributedDataLoader(pattern, layout["B"], layout["T"], rank, layout["P"])
        else:
            loader = DistributedDataLoader(pattern, layout["B"], layout["T"], rank, layout["P"], order="file")
        assert served(loader, tokens, layout["steps"]) == layout["served"][rank], f"rank {rank}"


@pytest.mark.parametrize("layout", [layout for layout in LAYOUTS if layout["P"] > 1], ids=layout_id)
def test_resume_anywhere_continues_with_llmcs_next_batch(tmp_path, layout):
    """A loader rebuilt from a JSON round trip of state_dict() after any number of batches (mid-shard, shard
    and epoch boundaries alike) serves exactly llm.c's remaining batches."""
    pattern, tokens = write_layout_shards(tmp_path, layout)
    rank, steps = layout["P"] - 1, layout["steps"]
    loader = DistributedDataLoader(pattern, layout["B"], layout["T"], rank, layout["P"], order=order_of(layout))
    for consumed in range(steps):
        state = json.loads(json.dumps(loader.state_dict()))
        assert all(isinstance(v, (int, str, list)) for v in state.values()), state
        resumed = DistributedDataLoader(pattern, layout["B"], layout["T"], rank, layout["P"], order=order_of(layout))
        resumed.load_state_dict(state)
        assert served(resumed, tokens, steps - consumed) == layout["served"][rank][consumed:], consumed
        loader.next_batch()


def test_mt19937_matches_llmc_rand_h():
    """The first outputs llm.c's rand.h documents for manual_seed(137) (PyTorch's manual_seed gives the same)."""
    assert Mt19937(137).next_u32(5).tolist() == [4053805790, 2173880614, 380293709, 1237255315, 2986595568]
