"""Small helpers shared by the stage tasks: log forwarding, child-process commands, artifact keys."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

from prefect import get_run_logger


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


def log_lines() -> Callable[[str], None]:
    """A line callback (for `run_streaming`) that logs each non-blank line of a child process to the task run."""
    logger = get_run_logger()
    return lambda line: logger.info(line) if line.strip() else None


def python_module(module: str, args: list[str]) -> list[str]:
    """The command that runs `python -m module args...` with this interpreter."""
    return [sys.executable, "-m", module, *args]
