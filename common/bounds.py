"""What a setting's value must be to reach every place it goes, checked before any stage uses it: text without
control characters, numbers within the type that holds them. The settings checks ask here for every value
(`gpt2.train_config.validate` for the training settings, `flows.config.check_settings` for the pipeline's
own, nested ones included), and so do the writers that must not trust their caller (`tasks.slurm.job_script`).

- Text holds no control character (C0, DEL, C1, the Unicode line and paragraph separators): a name or string
  setting reaches file names, a shell or Slurm script, log lines and TensorBoard tags, where a newline starts
  a line of its own (a command in a script, a forged log line) and an escape rewrites the terminal. A setting
  that is text by nature (a prompt, the Slurm setup's shell lines) may hold newlines and tabs.
- A number lies within the type it is used in: an integer within int64 unless a narrower type holds it (an
  int32 file header); a float is finite and, where float32 holds it (AdamW's arithmetic), neither beyond
  float32's largest value nor a non-zero value that float32 rounds to zero.
"""

from __future__ import annotations

import math
import struct
import sys
import unicodedata

INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1), "uint64": (0, 2**64 - 1)}
FLOAT_FORMATS = {"float32": "<f", "float64": "<d"}  # struct's formats: packing refuses what the type cannot hold
FLOAT_MAX = {"float32": struct.unpack("<f", b"\xff\xff\x7f\x7f")[0], "float64": sys.float_info.max}  # 3.4e38, 1.8e308
MULTILINE = "\n\t"  # what a setting that is text by nature may hold besides printable characters
_LINE_SEPARATORS = "\u2028\u2029"  # not control characters to Unicode, but line breaks to str.splitlines and editors


def control_characters(text: str, allowed: str = "") -> list[str]:
    """The control characters in `text`, each once, in order of appearance, less those `allowed`."""
    found = [c for c in text if c not in allowed and (unicodedata.category(c) == "Cc" or c in _LINE_SEPARATORS)]
    return list(dict.fromkeys(found))


def text_problem(name: str, text: str, allowed: str = "") -> str | None:
    """What is wrong with text setting `name`, or None: a control character, named with the value."""
    found = control_characters(text, allowed)
    if not found:
        return None
    return (f"{name} holds the control character(s) {' '.join(map(repr, found))} (got {text!r}): it reaches "
            "file names, scripts and log lines, where a newline starts a line of its own; remove them")


def number_problem(name: str, value: int | float, held_in: str | None = None) -> str | None:
    """What is wrong with numeric setting `name`, or None: beyond the range of `held_in` (default: int64 for an
    integer, float64 for a float), a float that is not finite, or one that `held_in` rounds to zero."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        low, high = INT_RANGES[held_in or "int64"]
        if not low <= value <= high:
            return f"{name}={value} is out of range: the {held_in or 'int64'} it is used in holds [{low}, {high}]"
        return None
    if not math.isfinite(value):
        return f"{name} must be a finite number, got {value}"
    kind = held_in or "float64"
    try:
        stored = struct.unpack(FLOAT_FORMATS[kind], struct.pack(FLOAT_FORMATS[kind], value))[0]
    except OverflowError:
        return (f"{name}={value} is beyond {kind}, the type it is used in (largest {FLOAT_MAX[kind]:.7g}); "
                f"choose a smaller {name}")
    if value != 0 and stored == 0:
        return f"{name}={value} rounds to 0 in {kind}, the type it is used in; choose a larger {name}"
    return None


def value_problem(name: str, value: object, held_in: str | None = None, multiline: bool = False) -> str | None:
    """`text_problem` for a string (newlines and tabs allowed where `multiline`), `number_problem` for a
    number, None for anything else."""
    if isinstance(value, str):
        return text_problem(name, value, MULTILINE if multiline else "")
    if isinstance(value, (int, float)):
        return number_problem(name, value, held_in)
    return None
