"""Training checkpoints: one directory per step, written atomically, verified before anything uses it.

Inside a run directory (gpt2.run_dir), `checkpoints/step_00001000/` holds:

    state.safetensors  every tensor of the state: model, optimizer moments, torch RNG states
    state.json         the rest as plain data: step, config, guard, per-rank data-loader and RNG states,
                       each tensor's place given as {"$tensor": name in state.safetensors}
    model.bin          the same weights as an llm.c model file (gpt2.llmc)
    COMPLETE           JSON marker, written last: {"step", "model_file_dtype", "files": {name: {"size", "sha256"}}}

Nothing in a checkpoint is unpickled: loading one cannot run code, whoever wrote the files (a sha256 in the
marker shows they are intact, not that they are trustworthy). Checkpoints of the older pickled format
(`state.pt`) are refused with the command that converts them (`python -m gpt2.checkpoint convert`).

A checkpoint is assembled in a hidden temporary directory and renamed into place (common.files.
atomic_directory), so a crash at any moment leaves either the whole checkpoint or none. A directory
without the marker is never used; one whose files differ from the sizes or hashes its marker lists fails
`verify_checkpoint` (gpt2.checkpoint_files, which needs no torch) with an error naming the file and what is wrong. An init checkpoint
(`write_initial_checkpoint`, the pipeline's init stage) holds only the model, at step 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file as load_tensors
from safetensors.torch import save_file as save_tensors

from common.cli import run_cli
from common.files import atomic_directory, json_file_text, json_text, parse_json, sha256_file, write_json
# the files' part of the checkpoint API, torch-free, is gpt2.checkpoint_files; importers of this module get it too
from gpt2.checkpoint_files import (COMPLETE_MARKER, DATA_FILE, MODEL_FILE, PICKLED_STATE_FILE,  # noqa: F401
                                   REJECTED_SUFFIX, TENSORS_FILE, CheckpointError, RejectedCheckpoint, is_complete,
                                   latest_checkpoint, list_checkpoints, newest_valid_checkpoint,
                                   require_current_format, set_aside, verify_checkpoint)
from gpt2.config import GPTConfig, parse_model_spec, require_weights_in_file
from gpt2.model import GPT
from gpt2.run_dir import RunDir


def save_checkpoint(
    out_dir: str | os.PathLike,
    step: int,
    state: dict[str, Any],
    model: GPT,
    model_file_dtype: str = "float32",
    keep_last: int | None = None,
) -> Path:
    """Write `state` (must hold "model") and an llm.c model file as checkpoint `step`, atomically; the marker,
    written last, lists each file's size and sha256 (hashed from disk, so it vouches for what was written).

    Then delete all but the newest `keep_last` complete checkpoints (step 0 is kept: it is an init
    checkpoint).
    """
    final = RunDir(out_dir).checkpoint(step)
    _write_checkpoint(final, step, state, model, model_file_dtype)
    if keep_last is not None:
        prune_checkpoints(out_dir, keep_last)
    return final


def _write_checkpoint(final: Path, step: int, state: dict[str, Any], model: GPT, model_file_dtype: str) -> None:
    """Write the checkpoint directory `final` atomically; a full disk is DiskFull naming it and every byte its files
    hold (checked before the first byte, and at the writes), and the checkpoints before it stay as they were."""
    from gpt2.llmc import model_file_size, write_model_file

    data, tensors = _split_tensors(state)
    text = json_text(data, final / DATA_FILE) + "\n"
    sizes = {TENSORS_FILE: safetensors_size(tensors), DATA_FILE: len(text.encode()),
             MODEL_FILE: model_file_size(model, model_file_dtype)}
    # the marker's size is known before the hashes are: each is 64 hex digits
    placeholder = _marker(step, model_file_dtype, {name: (size, "0" * 64) for name, size in sizes.items()})
    marker_size = len(json_file_text(placeholder, final / COMPLETE_MARKER).encode())
    with atomic_directory(final, sum(sizes.values()) + marker_size) as tmp:
        save_tensors(tensors, tmp / TENSORS_FILE)
        (tmp / DATA_FILE).write_text(text)
        write_model_file(model, tmp / MODEL_FILE, dtype=model_file_dtype)
        files = {name: ((tmp / name).stat().st_size, sha256_file(tmp / name)) for name in sizes}
        write_json(tmp / COMPLETE_MARKER, _marker(step, model_file_dtype, files))


def _marker(step: int, model_file_dtype: str, files: dict[str, tuple[int, str]]) -> dict[str, Any]:
    """The COMPLETE marker of a checkpoint whose files have these (size, sha256)."""
    return {"step": step, "model_file_dtype": model_file_dtype,
            "files": {name: {"size": size, "sha256": sha256} for name, (size, sha256) in files.items()}}


# safetensors' names of the dtypes it writes, in the order save_file lays their data out (its Dtype enum from
# the last: U64 first, BOOL last), the tensors of one dtype by name
_SAFETENSORS_DTYPES = {torch.uint64: "U64", torch.int64: "I64", torch.float64: "F64", torch.complex64: "C64",
                       torch.float32: "F32", torch.uint32: "U32", torch.int32: "I32", torch.bfloat16: "BF16",
                       torch.float16: "F16", torch.uint16: "U16", torch.int16: "I16",
                       torch.float8_e5m2fnuz: "F8_E5M2FNUZ", torch.float8_e4m3fnuz: "F8_E4M3FNUZ",
                       torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.int8: "I8",
                       torch.uint8: "U8", torch.bool: "BOOL"}
_SAFETENSORS_LAYOUT = {dtype: place for place, dtype in enumerate(_SAFETENSORS_DTYPES)}


def safetensors_size(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> int:
    """The bytes safetensors' `save_file(tensors, path, metadata)` writes: an 8-byte header length, the JSON
    header (compact; the tensors in the order their data is laid out, `_SAFETENSORS_DTYPES`; spaces to a
    multiple of 8 bytes), then the data. A pre-check of free space counts it before the write."""
    header: dict[str, Any] = {} if metadata is None else {"__metadata__": metadata}
    offset = 0
    for name, tensor in sorted(tensors.items(), key=lambda item: (_SAFETENSORS_LAYOUT[item[1].dtype], item[0])):
        header[name] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + tensor.nbytes]}
        offset += tensor.nbytes
    length = len(json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode())
    return 8 + length + (-length) % 8 + offset


def _split_tensors(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """(`state` as JSON-able plain data, its tensors by name): each tensor becomes {"$tensor": name}, a tuple
    {"$tuple": [...]}, a dict with keys other than strings (an optimizer's parameter ids) {"$items": [[k, v]]}.
    A tensor seen twice (tied weights) is stored once; both places name it."""
    tensors: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}  # a tensor view (storage, offset, shape, stride, dtype) -> its name
    storages: set[int] = set()

    def plain(value: Any, where: str) -> Any:
        if isinstance(value, torch.Tensor):
            view = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape), value.stride(),
                    value.dtype)
            if view not in seen:
                # safetensors refuses tensors sharing memory: a view of a stored tensor's memory is copied, into
                # host memory, where the writer moves every tensor anyway (a copy on the GPU would need room there:
                # 6.2 GB more at 1.5B parameters, whose master weights are views into one flat buffer)
                shares = view[0] in storages and value.numel() > 0
                tensors[where] = (value.to("cpu", copy=True) if shares else value).detach().contiguous()
                storages.add(view[0])
                seen[view] = where
            return {"$tensor": seen[view]}
        if isinstance(value, tuple):
            return {"$tuple": [plain(v, f"{where}/{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [plain(v, f"{where}/{i}") for i, v in enumerate(value)]
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in value):
                return {k: plain(v, f"{where}/{k}") for k, v in value.items()}
            return {"$items": [[k, plain(v, f"{where}/{k}")] for k, v in value.items()]}
        if isinstance(value, np.generic):
            return value.item()
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"checkpoint state {where or '/'}: cannot store a {type(value).__name__} as plain data")

    return plain(state, ""), tensors


def _join_tensors(data: Any, tensors: dict[str, torch.Tensor], where: Path) -> Any:
    """The inverse of `_split_tensors`; a tensor name missing from `tensors` is a CheckpointError."""
    def value(node: Any) -> Any:
        if isinstance(node, list):
            return [value(v) for v in node]
        if not isinstance(node, dict):
            return node
        if "$tensor" in node:
            if node["$tensor"] not in tensors:
                raise CheckpointError(f"{where}: names tensor {node['$tensor']!r}, which {TENSORS_FILE} lacks")
            return tensors[node["$tensor"]]
        if "$tuple" in node:
            return tuple(value(v) for v in node["$tuple"])
        if "$items" in node:
            return {k: value(v) for k, v in node["$items"]}
        return {k: value(v) for k, v in node.items()}

    return value(data)


def prune_checkpoints(out_dir: str | os.PathLike, keep_last: int) -> None:
    """Keep step 0 and the newest `keep_last` complete checkpoints. (Temporary folders of interrupted writes are
    removed when the next writer takes the run's lock: gpt2.run_dir.RunDir.lock.)"""
    checkpoints = [c for c in list_checkpoints(out_dir) if c[0] != 0]
    for _, path in checkpoints[: max(0, len(checkpoints) - keep_last)]:
        shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    hashes: bool = True) -> dict[str, Any]:
    """The state dict of a checkpoint directory that verifies (`verify_checkpoint`; `hashes=False` checks
    sizes only, for a checkpoint verified moments ago)."""
    path = Path(path)
    require_current_format(path, verify_checkpoint(path, hashes))
    tensors = read_tensors(path / TENSORS_FILE, CheckpointError, map_location)
    try:
        data = parse_json((path / DATA_FILE).read_text(), str(path / DATA_FILE), CheckpointError)
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path / DATA_FILE}: not valid JSON ({e})") from e
    state = _join_tensors(data, tensors, path / DATA_FILE)
    _check_model_config(state, path / DATA_FILE)
    return state


def _check_model_config(state: Any, where: Path) -> None:
    """A CheckpointError naming `where` unless its model_config is a model shape that its stored weights can
    fill: checked here, before any model of that shape is allocated."""
    try:
        config = model_config_of(state)
        stored = sum(t.numel() for name, t in state["model"].items() if name != "lm_head.weight")  # tied to wte
        require_weights_in_file(config, stored, str(where))
    except (KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{where}: no usable model_config and model weights ({type(e).__name__}: {e})") from e
    except ValueError as e:
        raise CheckpointError(str(e)) from e


def read_tensors(path: Path, error: type[Exception] = ValueError,
                 map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; one that cannot be read (a header too large for the file, bad JSON,
    offsets outside it: safetensors checks them before reading any tensor) raises `error` naming the file, which
    safetensors' own errors do not."""
    try:
        return load_tensors(path, device=str(map_location))
    except Exception as e:
        raise error(f"{path}: cannot be loaded ({type(e).__name__}: {e})") from e


def model_config_of(state: dict[str, Any]) -> GPTConfig:
    return GPTConfig(**state["model_config"])


def model_from_state(state: dict[str, Any], device: str | torch.device = "cpu", use_kernels: bool = False) -> GPT:
    model = GPT.empty(model_config_of(state), use_kernels=use_kernels)
    model.load_state_dict(state["model"])
    return model.to(device)


def write_initial_checkpoint(
    out_dir: str | os.PathLike, model: str | GPTConfig = "d12", seed: int = 42, model_file_dtype: str = "float32"
) -> Path:
    """Checkpoint step 0 of `out_dir`: the model initialised in llm.c's RNG order (gpt2.init) from `seed`.

    `model` is a descriptor (`d12`), an explicit shape spec (gpt2.config.parse_model_spec) or a GPTConfig.
    Training starts from it when given as its `init_from`.
    """
    config = parse_model_spec(model) if isinstance(model, str) else model
    gpt = GPT.create(config, seed=seed)
    state = {"step": 0, "model": gpt.state_dict(), "model_config": asdict(config), "init_seed": seed}
    return save_checkpoint(out_dir, 0, state, gpt, model_file_dtype=model_file_dtype)


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states as plain data and tensors: Python, NumPy, torch CPU and (when present) CUDA."""
    state = {"python": random.getstate(), "numpy": _plain_numpy_state(np.random.get_state(legacy=False)),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _plain_numpy_state(state: dict[str, Any]) -> dict[str, Any]:
    """NumPy's MT19937 state ({"bit_generator", "state": {"key": uint32 array, "pos"}, ...}) with the key as ints."""
    return {**state, "state": {**state["state"], "key": state["state"]["key"].tolist()}}


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    np.random.set_state({**numpy_state, "state": {**numpy_state["state"],
                                                  "key": np.asarray(numpy_state["state"]["key"], dtype=np.uint32)}})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------------------
# the older pickled format


def _numpy_rng_globals() -> list[Any]:
    """What a pickled NumPy RNG state (a uint32 array) needs beyond torch's weights-only defaults."""
    multiarray = getattr(np, "_core", np.core).multiarray  # numpy 2 renamed numpy.core
    return [multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def convert_pickled_checkpoint(path: str | os.PathLike) -> Path:
    """Rewrite a checkpoint of the older format (a pickled state.pt) in this one, in place and atomically.

    state.pt is read with `torch.load(weights_only=True)`: tensors and plain containers only, NumPy's RNG
    arrays allow-listed; a file that holds anything else (code) is refused by torch, and nothing is written.
    """
    path = Path(path)
    marker = verify_checkpoint(path)
    if PICKLED_STATE_FILE not in marker["files"]:
        raise CheckpointError(f"{path} is already in the current format (no {PICKLED_STATE_FILE})")
    try:
        with torch.serialization.safe_globals(_numpy_rng_globals()):
            state = torch.load(path / PICKLED_STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{path / PICKLED_STATE_FILE}: refused, it holds more than tensors and plain data "
                              f"({type(e).__name__}: {e})") from e
    for rng in state.get("rng", []):
        kind, key, pos, has_gauss, gauss = rng["numpy"]  # np.random.get_state()'s legacy tuple
        rng["numpy"] = {"bit_generator": kind, "state": {"key": key.tolist(), "pos": pos}, "has_gauss": has_gauss,
                        "gauss": gauss}
    _write_checkpoint(path, marker["step"], state, model_from_state(state), marker["model_file_dtype"])
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m gpt2.checkpoint",
        description="Checkpoint maintenance. `convert` rewrites checkpoints of the older pickled format "
        "(state.pt) as state.safetensors + state.json, reading state.pt without running any code in it.")
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("convert", help="convert checkpoint directories (step_XXXXXXXX) in place")
    convert.add_argument("checkpoints", nargs="+", type=Path, help="checkpoint directories holding state.pt")
    args = parser.parse_args(argv)
    for path in args.checkpoints:
        try:
            print(f"converted {convert_pickled_checkpoint(path)}")
        except CheckpointError as e:
            sys.exit(f"error: {e}")


if __name__ == "__main__":
    run_cli(main)
