"""The path policy: every path the pipeline builds under its `root`, or reads from a marker or manifest, goes
through here.

- A name from settings (a run name, a dataset name) is one path component and nothing else (`check_name`):
  no separator, not `.` or `..`, no glob metacharacters (a name is never a pattern), no control character
  (common.bounds: a newline would split the log lines and scripts that name it), at most NAME_MAX bytes.
  The settings check bounds a name further by the longest name a stage derives from it
  (`flows.config.longest_derived_names`).
- `under(root, *names)` joins names under `root` and resolves the result, symlinks at every level included;
  a path that resolves outside the resolved root is refused (PathOutsideRoot). `root` itself may be a link:
  the user chose it.
- `inside(path, folder)` refuses a path found on disk (a run directory, a checkpoint) that resolves outside
  the folder it was found in.
- `listed_file(folder, name, listed_in)` is the file a marker or manifest names: one component inside
  `folder`, so a crafted `/etc/hostname` or `../x` entry is refused, never hashed, read or deleted.
"""

from __future__ import annotations

import os
from pathlib import Path

from common.bounds import control_characters

GLOB_CHARACTERS = frozenset("*?[]")  # a name holding any of them would select other folders' files in a glob
NAME_MAX_BYTES = 255  # the longest file name Linux filesystems take (NAME_MAX)


class PathOutsideRoot(ValueError):
    """A path that would leave the folder it must stay in; the message names the path, where it leads and
    the folder."""


def check_name(value: str, what: str) -> str:
    """`value` if it can be one plain file or folder name; ValueError naming `what` otherwise.

    Names from settings are joined under an output folder: a separator, `..` or an absolute path would put
    the output somewhere else, and a glob character would make the stages that list files by pattern pick
    up other names' files.
    """
    if (not value or value in (".", "..") or any(c in value for c in "/\\")
            or GLOB_CHARACTERS.intersection(value) or control_characters(value)
            or len(value.encode()) > NAME_MAX_BYTES):
        raise ValueError(
            f"{what} must be a plain name (no '/', no '..', not absolute, not empty, none of "
            f"{' '.join(sorted(GLOB_CHARACTERS))}, no control character, at most {NAME_MAX_BYTES} bytes): it "
            f"becomes a folder or file name under the output folder; got {value!r}")
    return value


def inside(path: str | os.PathLike, folder: str | os.PathLike) -> Path:
    """`path` resolved (symlinks at every level), if that lies in `folder` (resolved too); PathOutsideRoot
    otherwise."""
    resolved, base = Path(path).resolve(), Path(folder).resolve()
    if not resolved.is_relative_to(base):
        raise PathOutsideRoot(f"{path} resolves to {resolved}, outside {base}; remove the symbolic link that "
                              "leads there or choose another name")
    return resolved


def under(root: str | os.PathLike, *names: str) -> Path:
    """root/names... resolved; PathOutsideRoot if it leaves `root` (a symlink on the way included).

    Each of `names` must be one plain component (`check_name`); fixed layout names ("data", "shards") and
    names from settings are treated alike.
    """
    for name in names:
        check_name(name, "a folder name")
    return inside(Path(root).joinpath(*names), root)


def listed_file(folder: str | os.PathLike, name: object, listed_in: str | os.PathLike) -> Path:
    """The file `name` that a marker or manifest (`listed_in`) lists in `folder`: a plain name that stays in
    `folder`. PathOutsideRoot naming both otherwise."""
    try:
        if not isinstance(name, str):
            raise ValueError("a file name is text")
        check_name(name, "a listed file")
        return inside(Path(folder) / name, folder)
    except ValueError as e:
        raise PathOutsideRoot(f"{listed_in} lists {name!r}, which is not a file of {folder} ({e}); the listing "
                              "was not written by the pipeline: delete the folder and rerun its stage") from None
