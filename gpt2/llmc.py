"""llm.c model files: read and write `gpt2_124M.bin`-style checkpoints byte for byte.

Layout: a header of 256 little-endian int32 (magic 20240326, version 3 = fp32 or 5 = bf16,
max_seq_len, vocab_size, n_layer, n_head, n_embd, padded_vocab_size), then 16 tensors back to back:
wte (Vp, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C), attprojw (L, C, C),
attprojb (L, C), ln2w (L, C), ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C),
lnfw (C), lnfb (C). Weights are in nn.Linear (out, in) layout, so a tensor stacked over layers is just
each layer's parameter, flattened, one after another. bf16 is written round-to-nearest-even.
"""

from __future__ import annotations

import os
from operator import attrgetter
from pathlib import Path

import numpy as np
import torch

from common.files import atomic_path
from gpt2.config import GPTConfig
from gpt2.model import GPT

MAGIC = 20240326
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
VERSION_DTYPES = {3: torch.float32, 5: torch.bfloat16}
DTYPE_VERSIONS = {"float32": 3, "bfloat16": 5}


# each layer's parameters in file order: ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b fcw fcb fcprojw fcprojb
_PER_LAYER = tuple(
    attrgetter(name)
    for name in (
        "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
        "mlp.c_proj.weight", "mlp.c_proj.bias",
    )
)  # fmt: skip


def _file_order(model: GPT) -> list[torch.Tensor]:
    """The model's parameters in the order their bytes appear in the file."""
    return (
        [model.transformer.wte.weight, model.transformer.wpe.weight]
        + [get(block) for get in _PER_LAYER for block in model.transformer.h]
        + [model.transformer.ln_f.weight, model.transformer.ln_f.bias]
    )


def _header(config: GPTConfig, version: int) -> np.ndarray:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [
        MAGIC,
        version,
        config.block_size,
        config.vocab_size,
        config.n_layer,
        config.n_head,
        config.n_embd,
        config.padded_vocab_size,
    ]
    return header


def model_file_size(model: GPT, dtype: str = "float32") -> int:
    """Bytes of `model`'s llm.c model file: the header, then every parameter in the file's dtype."""
    return HEADER_BYTES + sum(p.numel() for p in _file_order(model)) * VERSION_DTYPES[DTYPE_VERSIONS[dtype]].itemsize


def write_model_file(model: GPT, path: str | os.PathLike, dtype: str = "float32") -> Path:
    """Write `model` as an llm.c model file (version 3 for float32, 5 for bfloat16), atomically."""
    if dtype not in DTYPE_VERSIONS:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_VERSIONS)}, got {dtype!r}")
    torch_dtype = VERSION_DTYPES[DTYPE_VERSIONS[dtype]]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, size=model_file_size(model, dtype)) as tmp, open(tmp, "wb") as f:
        f.write(_header(model.config, DTYPE_VERSIONS[dtype]).tobytes())
        for param in _file_order(model):
            data = param.detach().to("cpu", torch_dtype).contiguous()  # float32 -> bf16 rounds to nearest even
            if torch_dtype == torch.bfloat16:
                data = data.view(torch.int16)  # numpy has no bfloat16: write the bits
            f.write(data.numpy().tobytes())
        f.flush()
        os.fsync(f.fileno())  # the checkpoint's COMPLETE marker vouches for this file
    return path


def read_header(path: str | os.PathLike) -> tuple[GPTConfig, int]:
    """(model config, version) from an llm.c model file's header, validated."""
    path = Path(path)
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise ValueError(f"{path}: {len(raw)} bytes is shorter than the {HEADER_BYTES}-byte llm.c header")
    header = np.frombuffer(raw, dtype="<i4")
    if header[0] != MAGIC:
        raise ValueError(f"{path}: bad magic {header[0]}; an llm.c model file starts with {MAGIC}")
    version = int(header[1])
    if version not in VERSION_DTYPES:
        raise ValueError(f"{path}: unknown model file version {version}; supported: 3 (float32), 5 (bfloat16)")
    block_size, vocab_size, n_layer, n_head, n_embd, padded_vocab_size = (int(v) for v in header[2:8])
    try:
        config = GPTConfig(n_layer, n_head, n_embd, block_size, vocab_size, padded_vocab_size)
    except ValueError as e:
        raise ValueError(f"{path}: the header describes an invalid model: {e}") from e
    return config, version


@torch.no_grad()
def read_model_file(path: str | os.PathLike, device: torch.device | str = "cpu") -> GPT:
    """Read an llm.c model file into a float32 GPT (a bf16 file gives its exact bf16 values)."""
    path = Path(path)
    config, version = read_header(path)
    itemsize = 4 if version == 3 else 2
    expected = HEADER_BYTES + itemsize * config.num_parameters  # from the header alone: nothing allocated yet
    actual = path.stat().st_size
    if actual != expected:
        problem = "is truncated" if actual < expected else "has trailing bytes"
        raise ValueError(
            f"{path}: file is {actual} bytes but its header (version {version}, L={config.n_layer}, "
            f"C={config.n_embd}, Vp={config.padded_vocab_size}, maxT={config.block_size}) needs {expected}; "
            f"the file {problem}"
        )
    model = GPT.empty(config)
    params = _file_order(model)
    body = np.fromfile(path, dtype="<f4" if version == 3 else "<i2", offset=HEADER_BYTES)
    flat = torch.from_numpy(body)
    if version == 5:
        flat = flat.view(torch.bfloat16)
    offset = 0
    for param in params:
        param.copy_(flat[offset : offset + param.numel()].view_as(param))  # bf16 -> float32 is exact
        offset += param.numel()
    return model.to(device)
