"""Hugging Face interop: export to / import from a `GPT2LMHeadModel` checkpoint directory.

Hugging Face GPT-2 stores its linear weights as Conv1D, i.e. (in, out): the transpose of our
nn.Linear (out, in). Its vocabulary is not padded, and its lm_head is tied to wte and not stored.
Export writes config.json + model.safetensors without needing transformers; import reads
model.safetensors or pytorch_model.bin, with or without the `transformer.` key prefix (the original
OpenAI checkpoint has none), so a directory a user downloaded from the hub loads as is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from common.files import atomic_path, write_json
from gpt2.config import GPTConfig
from gpt2.model import GPT

# the weights Hugging Face keeps as Conv1D (in, out)
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_REQUIRED_CONFIG_KEYS = ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size")
# buffers some checkpoints store next to the weights (the causal mask), not parameters
_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")


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


def export_hf(model: GPT, out_dir: str | os.PathLike) -> Path:
    """Write `model` as a directory `GPT2LMHeadModel.from_pretrained(out_dir)` loads."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
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
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    write_json(out_dir / "config.json", _hf_config(model.config))
    return out_dir


def _read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    if (directory / "model.safetensors").exists():
        from safetensors.torch import load_file

        return load_file(str(directory / "model.safetensors"))
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
    hf = json.loads(path.read_text())
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
