"""Distributed data loader over llm.c token shards: llm.c's DataLoader (llmc/dataloader.h), batch for batch.

Within a shard, the tokens are cut into samples of B*T+1 tokens (x is the first B*T, y the last B*T, i.e.
x shifted by one). Sample i of process r of P starts at token (i*P + r)*B*T, so the P processes together
read P*B*T consecutive tokens per step and never overlap. A shard of ntok tokens holds (ntok-1) // (P*B*T)
samples per process; after a shard's last sample the loader moves on to the next shard, and after the last
shard it starts a new epoch.

`order` says which shard and sample comes next:
- "llmc" (the default, what llm.c's train_gpt2.cu does for training): each epoch shuffles the shard order
  (the previous epoch's order, shuffled again) and, on entering a shard, shuffles its samples, all with
  llm.c's mt19937 seeded `seed + process_rank` and its random_permutation (data.llmc_rng), drawn in llm.c's
  order; so each process has its own order, as in llm.c.
- "file": shards in sorted-glob (or list) order, samples front to back (llm.c's unpermuted loader, which it
  uses for validation).

The position (epoch, shard position, sample position) is the whole state: `state_dict()` holds plain ints
and strings, and `load_state_dict()` replays the generator's draws up to that position, so a resumed run
continues with exactly the batch that would have come next.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from common.files import read_json
from data.llmc_rng import Mt19937, random_permutation
from data.shards import (MANIFEST, ShardError, listed_shard, manifest_shards, read_shard, shard_num_tokens,
                         shard_problem)
from data.tokenizer import VOCAB_SIZE

if TYPE_CHECKING:
    import torch

ORDERS = ("llmc", "file")  # the training batch orders; see the module docstring


def resolve_shards(files_or_glob: str | os.PathLike | Sequence[str | os.PathLike], split: str = "train") -> list[Path]:
    """The shards of a shard folder's manifest.json (those of `split`, in its order: what the pipeline hands
    over), a glob pattern (sorted matches) or an explicit list of shard paths (kept in order)."""
    if isinstance(files_or_glob, (str, os.PathLike)) and Path(files_or_glob).name == MANIFEST:
        return manifest_shards(files_or_glob, split)
    if isinstance(files_or_glob, (str, os.PathLike)):
        files = [Path(f) for f in sorted(glob.glob(str(files_or_glob)))]
        if not files:
            raise ShardError(f"no shards match {files_or_glob!s}")
        return files
    files = [Path(f) for f in files_or_glob]
    if not files:
        raise ShardError("the list of shard files is empty")
    return files


def _manifest_records(files: list[Path]) -> dict[Path, dict]:
    """Manifest entries (data.shards' manifest.json in a shard's folder) of the shards that have one."""
    records = {}
    for folder in {f.resolve().parent for f in files}:
        if (folder / MANIFEST).is_file():
            records.update({listed_shard(folder, r): r for r in read_json(folder / MANIFEST).get("shards", [])})
    return records


class DistributedDataLoader:
    """Yields (x, y) int64 CPU tensors of shape (B, T) for process `process_rank` of `num_processes`.

    files_or_glob: a shard folder's manifest.json (its shards of `split`, in order), a glob pattern (its
    matches, sorted) or a list of shard paths (kept in order).
    order: "llmc" (llm.c's permuted training order, the default) or "file"; seed: llm.c's is 42.
    """

    def __init__(
        self,
        files_or_glob: str | os.PathLike | Sequence[str | os.PathLike],
        B: int,
        T: int,
        process_rank: int = 0,
        num_processes: int = 1,
        order: str = "llmc",
        seed: int = 42,
        split: str = "train",
    ):
        if not 0 <= process_rank < num_processes:
            raise ValueError(f"process_rank must lie in [0, num_processes={num_processes}), got {process_rank}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        self.files = resolve_shards(files_or_glob, split)
        self.B, self.T, self.process_rank, self.num_processes = B, T, process_rank, num_processes
        self.order, self.seed = order, seed
        self.tokens_per_step = num_processes * B * T  # tokens all processes read together per batch
        self.samples_per_shard = []
        self.manifest_records = _manifest_records(self.files)
        for path in self.files:  # validate every header and size now, not hours into training
            ntok = shard_num_tokens(path)
            if ntok < self.tokens_per_step + 1:
                raise ShardError(
                    f"{path}: {ntok} tokens, fewer than one step of num_processes*B*T+1 = {self.tokens_per_step + 1}"
                )
            self.samples_per_shard.append((ntok - 1) // self.tokens_per_step)
        self.reset()

    # -- positions ------------------------------------------------------------------------------------

    def _seek(self, epoch: int, shard_pos: int) -> None:
        """Stand at the first sample of the shard_pos-th shard of `epoch`, with the generator where llm.c's
        is there: its draws before that point are replayed (shard orders applied, sample orders skipped)."""
        self.rng = Mt19937(self.seed + self.process_rank) if self.order == "llmc" else None
        self.shard_order = list(range(len(self.files)))
        for e in range(epoch + 1):
            self._shuffle(self.shard_order)
            for pos in range(len(self.files) if e < epoch else shard_pos):
                self._skip_shuffle(self.samples_per_shard[self.shard_order[pos]])
        self.epoch, self.shard_pos, self.sample_pos = epoch, shard_pos, 0
        self._enter_shard()

    def _shuffle(self, items: list[int]) -> None:
        if self.rng is not None:
            random_permutation(items, self.rng)

    def _skip_shuffle(self, n: int) -> None:
        """Advance the generator past the shuffle of n items (random_permutation draws n - 1 numbers)."""
        if self.rng is not None:
            self.rng.skip(n - 1)

    def _enter_shard(self) -> None:
        """Map the shard at self.shard_pos of this epoch's order and fix its sample order."""
        self.shard_idx = self.shard_order[self.shard_pos]
        self.tokens = self._verified_tokens(self.files[self.shard_idx])
        self.sample_order = list(range(self.samples_per_shard[self.shard_idx]))
        self._shuffle(self.sample_order)

    def _verified_tokens(self, path: Path) -> np.ndarray:
        """The shard's tokens, checked before use: against its manifest's sha256 where a manifest.json beside
        it lists it (one read of the shard, ~0.2 s per 10^8 tokens), else that every token is a GPT-2 id."""
        tokens = read_shard(path)
        record = self.manifest_records.get(path.resolve())
        if record is not None:
            if problem := shard_problem(path, record):
                raise ShardError(f"{problem}; rebuild it (python -m data.shards with the same arguments rebuilds "
                                 f"only bad shards, or rerun the tokenize stage)")
        elif (out_of_range := np.flatnonzero(tokens >= VOCAB_SIZE)).size:
            position = int(out_of_range[0])
            raise ShardError(f"{path}: token {int(tokens[position])} at position {position} is outside GPT-2's "
                             f"vocabulary (0..{VOCAB_SIZE - 1}); the shard is corrupt, rebuild it")
        return tokens

    def reset(self) -> None:
        """Go back to the first batch of epoch 0."""
        self._seek(0, 0)

    def _advance(self) -> None:
        self.sample_pos += 1
        if self.sample_pos < len(self.sample_order):
            return
        self.sample_pos = 0
        self.shard_pos += 1
        if self.shard_pos == len(self.files):  # a new epoch: llm.c reshuffles the current shard order
            self.shard_pos = 0
            self.epoch += 1
            self._shuffle(self.shard_order)
        self._enter_shard()

    # -- batches --------------------------------------------------------------------------------------

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        import torch  # here, not at the top: the pipeline's settings check reads ORDERS without torch

        B, T = self.B, self.T
        sample = self.sample_order[self.sample_pos]
        start = sample * self.tokens_per_step + self.process_rank * B * T
        buf = torch.from_numpy(self.tokens[start : start + B * T + 1].astype(np.int64))
        x = buf[:-1].view(B, T)  # (B, T)
        y = buf[1:].view(B, T)  # (B, T): the next token of each position of x
        self._advance()
        return x, y

    # -- resume ---------------------------------------------------------------------------------------

    def _identity(self) -> dict:
        return {
            "files": [p.name for p in self.files],
            "B": self.B,
            "T": self.T,
            "process_rank": self.process_rank,
            "num_processes": self.num_processes,
            "order": self.order,
            "seed": self.seed,
        }

    def state_dict(self) -> dict:
        """Position of the next batch, plus the settings it is only meaningful for."""
        return {**self._identity(), "epoch": self.epoch, "shard_pos": self.shard_pos, "sample_pos": self.sample_pos}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state` (from `state_dict()` of a loader with the same shards and settings)."""
        differing = {k: (state.get(k), v) for k, v in self._identity().items() if state.get(k) != v}
        if differing:
            raise ValueError(
                f"the loader state was saved with other {', '.join(differing)} than this loader has; resume with "
                f"the same shards, B, T, number of processes, order and seed"
            )
        if state["epoch"] < 0 or not 0 <= state["shard_pos"] < len(self.files):
            raise ValueError(f"the loader state's epoch {state['epoch']} / shard_pos {state['shard_pos']} is not a "
                             f"position of these {len(self.files)} shards")
        self._seek(state["epoch"], state["shard_pos"])
        if not 0 <= state["sample_pos"] < len(self.sample_order):
            raise ValueError(f"sample_pos {state['sample_pos']} is outside shard {self.files[self.shard_idx]}")
        self.sample_pos = state["sample_pos"]
