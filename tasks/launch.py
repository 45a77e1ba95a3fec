"""Run a command (torchrun, python -m gpt2.*) as a child process group, streaming its output line by line.

The child gets its own session, so the whole tree (torchrun and its per-GPU workers) can be signalled at
once. Whatever ends the wait — a non-zero exit, the task's timeout, a Prefect cancellation (SIGTERM turned
into an exception by Prefect's bridge), Ctrl-C — the group is sent SIGTERM, then SIGKILL after a grace
period, so no orphaned training process keeps holding GPUs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

KILL_GRACE_S = 15.0  # torchrun forwards SIGTERM to its workers and waits for them; give it time
TAIL_LINES = 40  # output lines quoted in the error of a failed command


class CommandFailed(RuntimeError):
    """The command exited non-zero; the message holds its last output lines."""

    def __init__(self, cmd: Sequence[str], returncode: int, tail: Sequence[str]):
        self.returncode = returncode
        lines = "\n".join(tail)
        super().__init__(f"{' '.join(cmd)} exited with code {returncode}; last output:\n{lines}")


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's multi-machine settings; the defaults are one machine (`--standalone`)."""

    nnodes: int = 1
    node_rank: int | None = None  # static rendezvous (with master_addr) when set
    rdzv_endpoint: str | None = None  # host:port of the c10d rendezvous (elastic, any node_rank)
    rdzv_id: str = "gpt2"
    master_addr: str | None = None
    master_port: int = 29500

    def torchrun_args(self) -> list[str]:
        if self.nnodes == 1:
            return ["--standalone"]
        if self.rdzv_endpoint:
            return [f"--nnodes={self.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={self.rdzv_endpoint}",
                    f"--rdzv-id={self.rdzv_id}"]
        if self.node_rank is None or not self.master_addr:
            raise ValueError(
                f"nnodes={self.nnodes} needs either rdzv_endpoint (host:port of the c10d rendezvous) or "
                "node_rank and master_addr (static rendezvous)"
            )
        return [f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}", f"--master-addr={self.master_addr}",
                f"--master-port={self.master_port}"]


def visible_gpus() -> int:
    """GPUs this machine would give torchrun (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def torchrun_command(module: str, args: Sequence[str], nproc: int, rendezvous: Rendezvous = Rendezvous()) -> list[str]:
    """`python -m torch.distributed.run ... -m module args` (the `torchrun` of this interpreter)."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    return [sys.executable, "-m", "torch.distributed.run", *rendezvous.torchrun_args(),
            f"--nproc-per-node={nproc}", "-m", module, *args]


def _kill_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the child's process group, then SIGKILL whatever is still alive after `grace_s`."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers: the leader's children may outlive it
    except ProcessLookupError:
        return
    proc.wait()


def run_streaming(
    cmd: Sequence[str],
    on_line: Callable[[str], None],
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    grace_s: float = KILL_GRACE_S,
) -> None:
    """Run `cmd`, calling `on_line` with each output line (stdout and stderr, merged) as it appears.

    Raises CommandFailed on a non-zero exit. On any exception while waiting (timeout, cancellation,
    interrupt) the process group is killed before the exception propagates.
    """
    proc = subprocess.Popen(
        list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}, cwd=cwd, text=True, errors="replace",
        bufsize=1, start_new_session=True,
    )  # fmt: skip
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            on_line(line)
        returncode = proc.wait()
    except BaseException:
        _kill_group(proc, grace_s)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    if returncode != 0:
        # a worker may outlive a failed torchrun leader; leave nothing behind
        _kill_group(proc, grace_s=1.0)
        raise CommandFailed(cmd, returncode, tail)

