"""Hugging Face interop: export to / import from a `GPT2LMHeadModel` checkpoint directory.

Hugging Face GPT-2 stores its linear weights as Conv1D, i.e. (in, out): the transpose of our
nn.Linear (out, in). Its vocabulary is not padded, and its lm_head is tied to wte and not stored.
Export writes a complete directory without needing transformers: model.safetensors, config.json and the
GPT-2 tokenizer (vocab.json, merges.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json),
built offline from the BPE files the tiktoken encoding uses (data.tokenizer), so
`GPT2LMHeadModel.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)` load it with no network.
Import reads model.safetensors or pytorch_model.bin, with or without the `transformer.` key prefix (the
original OpenAI checkpoint has none), so a directory a user downloaded from the hub loads as is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from common.files import atomic_directory, json_file_text, json_text, parse_json, utf8_text
from data.tokenizer import EOT, gpt2_bpe_files
from gpt2.checkpoint import safetensors_size
from gpt2.config import VOCAB_SIZE as GPT2_VOCAB_SIZE
from gpt2.config import GPTConfig, require_weights_in_file
from gpt2.model import GPT

# the weights Hugging Face keeps as Conv1D (in, out)
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_REQUIRED_CONFIG_KEYS = ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size")
# buffers some checkpoints store next to the weights (the causal mask), not parameters
_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")
EOT_TEXT = "<|endoftext|>"  # GPT-2's one special token, id 50256: its bos, eos and unk token on the hub


def _hf_config(config: GPTConfig) -> dict:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_ctx": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",  # the tanh GELU
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def _tokenizer_json(vocab: dict[str, int], merges: list[str]) -> dict:
    """The `tokenizers` serialization of GPT-2's byte-level BPE: the regex pre-tokenizer and byte mapping
    tiktoken's gpt2 encoding also uses, no normalizer, `<|endoftext|>` as a special added token."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": EOT, "content": EOT_TEXT, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": {**byte_level, "trim_offsets": False},
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "vocab": vocab, "merges": merges},
    }  # fmt: skip


def tokenizer_files(model_max_length: int) -> dict[str, bytes]:
    """GPT-2's tokenizer as Hugging Face keeps it, from OpenAI's sha256-checked BPE files, offline: {file name:
    its bytes}, whole before any is written, so an export counts them in the space it needs.

    vocab.json is OpenAI's encoder.json and merges.txt its vocab.bpe (the files tiktoken's gpt2 encoding is
    built from); tokenizer.json holds both for the fast tokenizer. Text without `<|endoftext|>` gets
    tiktoken's `encode_ordinary` ids; the literal `<|endoftext|>` becomes the special token 50256, as in
    tiktoken's `encode(text, allowed_special="all")` (pass `split_special_tokens=True` to split it instead).
    """
    sources = gpt2_bpe_files()
    vocab_bytes, merges_bytes = Path(sources["encoder.json"]).read_bytes(), Path(sources["vocab.bpe"]).read_bytes()
    vocab = json.loads(vocab_bytes.decode("utf-8"))
    merges = merges_bytes.decode("utf-8").split("\n")[1:-1]  # a version line first
    special = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}
    return {
        "vocab.json": vocab_bytes,
        "merges.txt": merges_bytes,
        "tokenizer.json": json_text(_tokenizer_json(vocab, merges), "tokenizer.json", ensure_ascii=False).encode(),
        "special_tokens_map.json": json_file_text(special, "special_tokens_map.json").encode(),
        "tokenizer_config.json": json_file_text({
            "tokenizer_class": "GPT2Tokenizer", **special, "model_max_length": model_max_length,
            "add_prefix_space": False, "add_bos_token": False, "clean_up_tokenization_spaces": False,
            "errors": "replace",
        }, "tokenizer_config.json").encode(),
    }  # fmt: skip


def export_hf(model: GPT, out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write `model` and GPT-2's tokenizer as a directory that `GPT2LMHeadModel.from_pretrained(out_dir)`
    and `AutoTokenizer.from_pretrained(out_dir)` load offline.

    The tokenizer files are written when the model has GPT-2's vocabulary (50257 tokens).
    The directory is assembled under a temporary name and renamed into place, so it is either complete or
    absent. An existing non-empty `out_dir` is replaced only with `overwrite`; otherwise FileExistsError.
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    if out_dir.is_file():
        raise FileExistsError(f"{out_dir} is a file; the export is a directory: choose another name")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} exists and is not empty; choose another directory or overwrite it "
                              "(--force)")
    V = model.config.vocab_size
    tensors = {}
    for name, param in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to wte
        tensor = param.detach().to("cpu", torch.float32)
        if name == "transformer.wte.weight":
            tensor = tensor[:V]  # (V, C): drop the padding rows
        elif name.endswith(_CONV1D_SUFFIXES):
            tensor = tensor.t()  # (out, in) -> Conv1D (in, out)
        tensors[name] = tensor.contiguous()
    # GPT-2's tokenizer fits only GPT-2's vocabulary (not e.g. a test model's)
    files = tokenizer_files(model.config.block_size) if V == GPT2_VOCAB_SIZE else {}
    files["config.json"] = json_file_text(_hf_config(model.config), out_dir / "config.json").encode()
    metadata = {"format": "pt"}
    # every byte the directory will hold, checked before the first one is written (atomic_directory)
    needed = safetensors_size(tensors, metadata) + sum(map(len, files.values()))
    with atomic_directory(out_dir, needed) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata=metadata)
        for name, data in files.items():
            (tmp / name).write_bytes(data)
    return out_dir


def _read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    if (directory / "model.safetensors").exists():
        from gpt2.checkpoint import read_tensors

        return read_tensors(directory / "model.safetensors")
    if (directory / "pytorch_model.bin").exists():
        return torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(
        f"{directory}: no model.safetensors or pytorch_model.bin; "
        "expected a Hugging Face GPT-2 checkpoint directory"
    )


def _config_from_hf(directory: Path) -> GPTConfig:
    path = directory / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing; expected a Hugging Face GPT-2 checkpoint directory")
    hf = parse_json(utf8_text(path.read_bytes(), str(path), ValueError), str(path))  # a user's file: errors name it
    missing = [key for key in _REQUIRED_CONFIG_KEYS if key not in hf]
    if missing:
        raise ValueError(f"{path}: not a Hugging Face GPT-2 config, it lacks {', '.join(missing)}")
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"{path}: model_type is {hf['model_type']!r}, only 'gpt2' can be imported")
    if hf.get("n_inner") not in (None, 4 * hf["n_embd"]):
        raise ValueError(f"{path}: n_inner={hf['n_inner']} is not 4*n_embd; this model has no such MLP")
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"{path}: activation_function {hf['activation_function']!r} is not the tanh GELU")
    return GPTConfig(
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        n_embd=hf["n_embd"],
        block_size=hf["n_positions"],
        vocab_size=hf["vocab_size"],
    )


@torch.no_grad()
def import_hf(directory: str | os.PathLike, device: torch.device | str = "cpu") -> GPT:
    """Read a Hugging Face GPT-2 checkpoint directory (ours or a downloaded one) into a GPT."""
    directory = Path(directory)
    config = _config_from_hf(directory)
    state = _read_state_dict(directory)
    state = {
        (k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"): v
        for k, v in state.items()
        if not k.endswith(_BUFFER_SUFFIXES)
    }
    stored = sum(t.numel() for name, t in state.items() if name != "lm_head.weight")  # lm_head: a copy of wte
    require_weights_in_file(config, stored, str(directory))
    model = GPT.empty(config)
    ours = model.state_dict()
    missing = sorted(set(ours) - set(state) - {"lm_head.weight"})
    unexpected = sorted(set(state) - set(ours))
    if missing or unexpected:
        raise ValueError(
            f"{directory}: checkpoint keys do not match GPT-2: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    model.transformer.wte.weight.zero_()  # padding rows
    for name, tensor in state.items():
        if name == "lm_head.weight":
            continue  # tied to wte
        target = ours[name]
        if name == "transformer.wte.weight":
            target = target[: config.vocab_size]
        elif name.endswith(_CONV1D_SUFFIXES):
            tensor = tensor.t()  # Conv1D (in, out) -> (out, in)
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"{directory}: {name} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}")
        target.copy_(tensor)
    return model.to(device)
