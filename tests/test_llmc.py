"""llm.c model files: byte images built here with struct, round trips, and clear errors."""

import struct

import numpy as np
import pytest
import torch

from gpt2.config import GPTConfig
from gpt2.llmc import read_model_file, write_model_file
from gpt2.model import GPT

CONFIG = GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=6, vocab_size=50, padded_vocab_size=64)


def _bf16_rne_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits with round-to-nearest-even, by integer arithmetic (no torch)."""
    bits = x.astype("<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2")


def _expected_bytes(model: GPT, version: int) -> bytes:
    """llm.c's layout written out by hand: header then 16 tensors, per-layer ones stacked over L."""
    c = model.config
    header = struct.pack("<8i", 20240326, version, c.block_size, c.vocab_size, c.n_layer, c.n_head, c.n_embd, c.padded_vocab_size)
    header += b"\0" * (1024 - len(header))
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    h = lambda name: np.stack([sd[f"transformer.h.{l}.{name}"] for l in range(c.n_layer)])
    tensors = [
        sd["transformer.wte.weight"], sd["transformer.wpe.weight"],
        h("ln_1.weight"), h("ln_1.bias"), h("attn.c_attn.weight"), h("attn.c_attn.bias"),
        h("attn.c_proj.weight"), h("attn.c_proj.bias"), h("ln_2.weight"), h("ln_2.bias"),
        h("mlp.c_fc.weight"), h("mlp.c_fc.bias"), h("mlp.c_proj.weight"), h("mlp.c_proj.bias"),
        sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"],
    ]  # fmt: skip
    encode = (lambda t: t.astype("<f4").tobytes()) if version == 3 else (lambda t: _bf16_rne_bits(t).tobytes())
    return header + b"".join(encode(t) for t in tensors)


def _randomized_model() -> GPT:
    model = GPT.create(CONFIG, seed=5)
    with torch.no_grad():  # non-trivial LayerNorms and biases so every tensor's position matters
        for p in model.parameters():
            p.add_(torch.randn_like(p))
        model.transformer.wte.weight[CONFIG.vocab_size :] = 0
    return model


@pytest.mark.parametrize("dtype,version", [("float32", 3), ("bfloat16", 5)])
def test_written_bytes_equal_the_hand_built_image(tmp_path, dtype, version):
    model = _randomized_model()
    path = write_model_file(model, tmp_path / "model.bin", dtype=dtype)
    assert path.read_bytes() == _expected_bytes(model, version)


def test_bf16_rounds_to_nearest_even_at_ties(tmp_path):
    model = GPT.create(CONFIG, seed=0)
    # 1 + 2^-8 is exactly halfway between two bf16 values: the even one is 1.0; 1 + 3*2^-8 rounds up
    with torch.no_grad():
        model.transformer.ln_f.weight[:2] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8])
    path = write_model_file(model, tmp_path / "m.bin", dtype="bfloat16")
    lnfw = np.frombuffer(path.read_bytes()[-4 * CONFIG.n_embd : -4 * CONFIG.n_embd + 4], dtype="<u2")
    assert list(lnfw) == [0x3F80, 0x3F82]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_gives_identical_tensors_and_bytes(tmp_path, dtype):
    model = _randomized_model()
    first = write_model_file(model, tmp_path / "a.bin", dtype=dtype)
    loaded = read_model_file(first)
    second = write_model_file(loaded, tmp_path / "b.bin", dtype=dtype)
    assert first.read_bytes() == second.read_bytes()
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        expected = a if dtype == "float32" else a.to(torch.bfloat16).float()
        assert torch.equal(expected, b), name
    assert not list(tmp_path.glob("*.tmp"))


def test_reloaded_model_computes_the_same_logits(tmp_path):
    model = _randomized_model()
    loaded = read_model_file(write_model_file(model, tmp_path / "m.bin"))
    idx = torch.randint(0, CONFIG.vocab_size, (2, 6))
    torch.testing.assert_close(loaded(idx)[0], model(idx)[0], rtol=0, atol=0)


def _corrupt(tmp_path, edit):
    path = write_model_file(GPT.create(CONFIG, seed=0), tmp_path / "m.bin")
    data = bytearray(path.read_bytes())
    path.write_bytes(edit(data))
    return path


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda d: struct.pack("<i", 1234) + d[4:], "bad magic 1234"),
        (lambda d: d[:4] + struct.pack("<i", 4) + d[8:], "unknown model file version 4"),
        (lambda d: d[:-10], "is truncated"),
        (lambda d: d + b"\0\0", "has trailing bytes"),
        (lambda d: d[:100], "shorter than the 1024-byte llm.c header"),
        (lambda d: d[:20] + struct.pack("<i", 3) + d[24:], "invalid model"),  # n_head=3 does not divide C=8
    ],
)
def test_bad_files_fail_naming_the_file_and_the_problem(tmp_path, edit, message):
    path = _corrupt(tmp_path, edit)
    with pytest.raises(ValueError, match=message) as info:
        read_model_file(path)
    assert str(path) in str(info.value)
