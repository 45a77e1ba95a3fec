"""Distributed data loader over llm.c token shards, following llm.c's DistributedDataLoader.

Within a shard, the tokens are cut into samples of B*T+1 tokens (x is the first B*T, y the last B*T, i.e.
x shifted by one). Sample i of rank r of P starts at token (i*P + r)*B*T, so the P ranks together read
P*B*T consecutive tokens per step and never overlap. A shard of ntok tokens holds (ntok-1) // (P*B*T)
samples per rank; when the next sample would not fit, the loader moves on to the next shard, and after
the last shard it starts a new epoch at the first.

With shuffle=True, every epoch visits the shards in a random order and each shard's samples in a random
order, drawn from a generator seeded by (seed, rank, epoch[, shard]); so ranks differ, and any position
can be recomputed from (epoch, shard position, sample position) alone. That triple is the whole state:
`state_dict()` / `load_state_dict()` resume with exactly the batch that would have been read next.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from common.files import read_json
from data.shards import MANIFEST, ShardError, read_shard, shard_num_tokens, shard_problem
from data.tokenizer import VOCAB_SIZE


def resolve_shards(files_or_glob: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """A glob pattern (sorted matches) or an explicit list of shard paths (kept in order)."""
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
            records.update({folder / r["file"]: r for r in read_json(folder / MANIFEST).get("shards", [])})
    return records


class DistributedDataLoader:
    """Yields (x, y) int64 CPU tensors of shape (B, T) for rank `rank` of `world_size`."""

    def __init__(
        self,
        files_or_glob: str | os.PathLike | Sequence[str | os.PathLike],
        B: int,
        T: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = False,
        seed: int = 42,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
        self.files = resolve_shards(files_or_glob)
        self.B, self.T, self.rank, self.world_size = B, T, rank, world_size
        self.shuffle, self.seed = shuffle, seed
        self.tokens_per_step = world_size * B * T  # tokens all ranks read together per batch
        self.samples_per_shard = []
        self.manifest_records = _manifest_records(self.files)
        for path in self.files:  # validate every header and size now, not hours into training
            ntok = shard_num_tokens(path)
            if ntok < self.tokens_per_step + 1:
                raise ShardError(
                    f"{path}: {ntok} tokens, fewer than one step of world_size*B*T+1 = {self.tokens_per_step + 1}"
                )
            self.samples_per_shard.append((ntok - 1) // self.tokens_per_step)
        self.reset()

    # -- positions ------------------------------------------------------------------------------------

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.rank, *key])

    def _shard_order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.files))
        return self._rng(self.epoch).permutation(len(self.files))

    def _enter_shard(self) -> None:
        """Map the shard at self.shard_pos of this epoch's order and fix its sample order."""
        self.shard_idx = int(self._shard_order()[self.shard_pos])
        self.tokens = self._verified_tokens(self.files[self.shard_idx])
        n = self.samples_per_shard[self.shard_idx]
        self.sample_order = self._rng(self.epoch, self.shard_idx).permutation(n) if self.shuffle else np.arange(n)

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
        self.epoch, self.shard_pos, self.sample_pos = 0, 0, 0
        self._enter_shard()

    def _advance(self) -> None:
        self.sample_pos += 1
        if self.sample_pos < len(self.sample_order):
            return
        self.sample_pos = 0
        self.shard_pos += 1
        if self.shard_pos == len(self.files):
            self.shard_pos = 0
            self.epoch += 1
        self._enter_shard()

    # -- batches --------------------------------------------------------------------------------------

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = self.B, self.T
        sample = int(self.sample_order[self.sample_pos])
        start = sample * self.tokens_per_step + self.rank * B * T
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
            "rank": self.rank,
            "world_size": self.world_size,
            "shuffle": self.shuffle,
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
                f"the same shards, B, T, world size, shuffle and seed"
            )
        self.epoch, self.shard_pos = state["epoch"], state["shard_pos"]
        self._enter_shard()
        if not 0 <= state["sample_pos"] < len(self.sample_order):
            raise ValueError(f"sample_pos {state['sample_pos']} is outside shard {self.files[self.shard_idx]}")
        self.sample_pos = state["sample_pos"]
