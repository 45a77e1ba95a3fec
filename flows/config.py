"""The pipeline's one typed config (a flow parameter) and where each stage puts its output."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data.hellaswag import HELLASWAG_VAL_URL
from tasks.evaluate import EvalSettings
from tasks.launch import Rendezvous


@dataclass(frozen=True)
class PipelineConfig:
    """Defaults: llm.c's GPT-2 (124M) run on FineWeb sample-10BT. Every output goes under `root`."""

    root: str = "artifacts"
    # documents and shards
    source: str = "HuggingFaceFW/fineweb"  # hub id, or a local folder/file of parquet/jsonl (offline)
    source_config: str | None = "sample-10BT"
    limit: int | None = None  # use only the first `limit` documents
    dataset: str = "fineweb10B"  # shard name prefix and folder name
    shard_size: int = 10**8
    tokenize_workers: int | None = None  # default: all cores; does not change the shards
    hellaswag_source: str | None = HELLASWAG_VAL_URL  # URL or local jsonl; None: no HellaSwag
    # model and training
    model: str = "d12"
    seed: int = 42
    # weights to start from instead of llm.c's init: one of our checkpoints, an llm.c model file or a Hugging
    # Face GPT-2 directory (continued pretraining, fine-tuning from GPT-2); its shape must be `model`'s
    init_from: str | None = None
    run_name: str = "gpt2-124m"
    train: dict[str, Any] = field(default_factory=dict)  # gpt2.train_config.TrainConfig fields, e.g. max_steps
    nproc: int | None = None  # processes per node; default one per visible GPU, else 1
    rendezvous: Rendezvous = Rendezvous()  # torchrun across machines (docs/pipeline.md)
    train_timeout_s: float | None = None
    # evaluation and sampling
    eval: EvalSettings = EvalSettings()
    sample_prompt: str = "Hello, I'm a language model,"
    num_samples: int = 4
    sample_tokens: int = 64

    @property
    def documents_dir(self) -> Path:
        return Path(self.root) / "data" / self.dataset / "documents"

    @property
    def shards_dir(self) -> Path:
        return Path(self.root) / "data" / self.dataset / "shards"

    @property
    def hellaswag_dir(self) -> Path:
        return Path(self.root) / "eval" / "hellaswag"

    @property
    def init_dir(self) -> Path:
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.model).strip("-")
        return Path(self.root) / "init" / f"{slug}-seed{self.seed}"

    @property
    def runs_dir(self) -> Path:
        return Path(self.root) / "runs" / self.run_name
