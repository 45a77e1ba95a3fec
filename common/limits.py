"""This machine's limits, that settings and file headers are checked against before anything is allocated."""

from __future__ import annotations

import os


def physical_memory() -> int:
    """Bytes of RAM this machine has (not what is free now: a check against it gives the same answer every time)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def usable_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0))


def gigabytes(nbytes: int) -> str:
    return f"{nbytes / 1e9:,.1f} GB"
