"""Model shapes: llm.c's model descriptors (`d12`, `gpt3:c768`, ...) as a typed config."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from common.bounds import number_problem

VOCAB_SIZE = 50257

# Where and in what precision a model runs: the choices of every entry point (gpt2.train, .evaluate, .sample).
# Here, not in gpt2.distributed, so that the pipeline's settings check them without importing torch.
DEVICES = ("auto", "cuda", "cpu")
DEVICE_HELP = "where the model runs: auto (this rank's GPU when CUDA is available, else the CPU), cuda or cpu"
DTYPES = ("auto", "bfloat16", "float32")  # autocast dtype of the forward pass; `auto`: bf16 on CUDA, fp32 on CPU


def padded_vocab(vocab_size: int, multiple: int = 128) -> int:
    """Vocabulary rounded up to a multiple of 128 for fast matmuls (50257 -> 50304); padding rows stay 0."""
    return -(-vocab_size // multiple) * multiple


# llm.c's descriptor tables (train_gpt2.cu), exactly; vocab 50257 padded to 50304 for all of them.
# GPT-2 family `dN` (or `gpt2:dN`), max_seq_len 1024: depth -> (channels, heads). d6, d60, d72, d84 are
# llm.c's unofficial sizes.
_GPT2_SHAPES = {
    6: (384, 6), 12: (768, 12), 24: (1024, 16), 36: (1280, 20), 48: (1600, 25),
    60: (1920, 30), 72: (2880, 30), 84: (3456, 36),
}  # fmt: skip
# GPT-3 family `gpt3:cN`, max_seq_len 2048: channels -> (depth, head size); heads = channels / head size.
# llm.c also lists c5140 (13B), which its own assert rejects (5140 is not a multiple of 128): left out.
_GPT3_SHAPES = {
    384: (6, 64), 768: (12, 64), 1024: (24, 64), 1536: (24, 96), 2048: (24, 128),
    2560: (32, 80), 4096: (32, 128), 12288: (96, 128),
}  # fmt: skip

@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024  # max_seq_len
    vocab_size: int = VOCAB_SIZE
    padded_vocab_size: int | None = None  # None: vocab_size rounded up to a multiple of 128

    def __post_init__(self) -> None:
        if self.padded_vocab_size is None and self.vocab_size > 0:
            object.__setattr__(self, "padded_vocab_size", padded_vocab(self.vocab_size))  # frozen dataclass
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "padded_vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GPTConfig.{name} must be positive, got {getattr(self, name)}")
            if problem := number_problem(name, getattr(self, name), "int32"):  # llm.c's model file header
                raise ValueError(f"GPTConfig.{problem} (llm.c's model file header stores it)")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(
                f"GPTConfig: padded_vocab_size={self.padded_vocab_size} < vocab_size={self.vocab_size}"
            )

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def num_parameters(self) -> int:
        """Parameters of the model of this shape, counted from its dimensions alone (nothing allocated): wte with
        its padding rows (tied to lm_head), wpe, per layer 12*C^2 + 13*C (attention, MLP, two layer norms), ln_f."""
        C = self.n_embd
        return self.padded_vocab_size * C + self.block_size * C + self.n_layer * (12 * C * C + 13 * C) + 2 * C

    @classmethod
    def from_descriptor(cls, descriptor: str) -> "GPTConfig":
        """`dN` or `gpt2:dN` (GPT-2 family, N layers) or `gpt3:cN` (GPT-3 family, N channels), as llm.c names them."""
        if m := re.fullmatch(r"(?:gpt2:)?d(\d+)", descriptor):
            depth = int(m.group(1))
            if depth in _GPT2_SHAPES:
                channels, heads = _GPT2_SHAPES[depth]
                return cls(n_layer=depth, n_head=heads, n_embd=channels, block_size=1024)
        elif m := re.fullmatch(r"gpt3:c(\d+)", descriptor):
            channels = int(m.group(1))
            if channels in _GPT3_SHAPES:
                depth, head_size = _GPT3_SHAPES[channels]
                return cls(n_layer=depth, n_head=channels // head_size, n_embd=channels, block_size=2048)
        known = [f"d{d}" for d in _GPT2_SHAPES] + [f"gpt3:c{c}" for c in _GPT3_SHAPES]
        raise ValueError(f"unknown model descriptor {descriptor!r}; known: {', '.join(known)}")


def require_weights_in_file(config: GPTConfig, stored: int, where: str) -> None:
    """ValueError naming `where` unless a file that holds `stored` weights can hold a model of `config`'s shape
    (wte's padding rows aside, which no file has to store): dimensions read from a header or a config file are
    checked against the file itself before the model is allocated, so a few bytes cannot ask for gigabytes."""
    needed = config.num_parameters - (config.padded_vocab_size - config.vocab_size) * config.n_embd
    if stored < needed:
        raise ValueError(
            f"{where}: describes a model of {needed:,} weights (n_layer={config.n_layer}, n_embd={config.n_embd}, "
            f"vocab_size={config.vocab_size}, block_size={config.block_size}) but holds {stored:,}; "
            "it is corrupt or not this model's")


def parse_model_spec(spec: str) -> GPTConfig:
    """A descriptor (`d12`, `gpt3:c768`), or an explicit shape `n_layer=2,n_head=2,n_embd=64,...` for small
    test models; ValueError names what is wrong."""
    if "=" not in spec:
        return GPTConfig.from_descriptor(spec)
    known = {f.name for f in dataclasses.fields(GPTConfig)}
    kwargs = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in known:
            raise ValueError(f"model: unknown shape field {key!r} in {spec!r}; known: {', '.join(sorted(known))}")
        try:
            kwargs[key] = int(value)
        except ValueError:
            raise ValueError(f"model: {key}={value!r} in {spec!r} is not an integer") from None
    return GPTConfig(**kwargs)  # an unset padded_vocab_size is derived from vocab_size
