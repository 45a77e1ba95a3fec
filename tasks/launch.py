"""Run a command (torchrun, python -m gpt2.*) as a child process group, streaming its output line by line.

A training process must never outlive its flow run (it would keep the GPUs). Three layers make sure:

1. Every command runs in a session of its own, started through `common.lifetime`, so the kernel sends it
   SIGTERM when the thread that started it dies, however it dies (SIGKILL included). torchrun's ranks
   are started the same way, because torchrun puts them in sessions of their own.
2. Whatever ends the wait in `run_streaming` -- a non-zero exit, the task's timeout, an exception from
   the line callback -- the group gets SIGTERM, then SIGKILL after a grace period. Output is read on a
   helper thread, so the waiting thread stays responsive to the exceptions Prefect raises in it.
3. `stop_children_on_exit()` wraps a flow body: on any exception reaching it (Prefect's termination on
   SIGTERM, a cancellation, Ctrl-C) it kills every command still running in this process, including those
   of tasks running on other threads, and refuses to start new ones, so a retry cannot relaunch training.
   Work running elsewhere (a Slurm job, tasks.slurm) registers its stop with `stopped_with_flow_run`, and is
   stopped the same way.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from common.cli import error_line_type

KILL_GRACE_S = 15.0  # torchrun forwards SIGTERM to its workers and waits for them; give it time
TAIL_LINES = 40  # output lines quoted in the error of a failed command
POLL_S = 0.2  # how often the waiting thread wakes up (exceptions Prefect injects land between waits)

_running: set[subprocess.Popen] = set()
_remote_stops: set[Callable[[], None]] = set()  # how to stop each job running elsewhere (a Slurm job's cancel)
_running_lock = threading.Lock()
_stopping = threading.Event()  # set once this process's flow run is being torn down


ERROR_LINES = 8  # a child's own error lines kept (one per rank that failed, a few ranks)


class ChildOutput:
    """What a child's output says about its end: its last lines, and the error lines it ended with (`error:
    Type: message`, common.cli) however much followed them (torchrun's report of a failure is longer than
    the tail)."""

    def __init__(self) -> None:
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.errors: deque[str] = deque(maxlen=ERROR_LINES)

    def add(self, line: str) -> None:
        self.tail.append(line)
        if error_line_type(line) is not None:
            self.errors.append(line)

    def said(self) -> list[str]:
        """The error lines that left the tail, then the tail: what a failure message quotes and the retry
        policy reads."""
        return [line for line in self.errors if line not in self.tail] + list(self.tail)


class CommandFailed(RuntimeError):
    """The command exited non-zero; the message holds its own error lines and its last output lines."""

    def __init__(self, cmd: Sequence[str], returncode: int, said: Sequence[str]):
        self.returncode = returncode
        lines = "\n".join(said)
        super().__init__(f"{' '.join(cmd)} exited with code {returncode}; last output:\n{lines}")


class Stopped(RuntimeError):
    """The command was killed because its flow run is ending (cancelled, crashed, interrupted); not retried."""


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's multi-machine settings; the defaults are one machine (`--standalone`)."""

    nnodes: int = 1
    node_rank: int | None = None  # static rendezvous (with master_addr) when set
    rdzv_endpoint: str | None = None  # host:port of the c10d rendezvous (elastic, any node_rank)
    rdzv_id: str | None = None  # default: the training run's id (a new id per run, shared by its nodes)
    master_addr: str | None = None
    master_port: int = 29500
    max_restarts: int = 0  # torchrun restarts all ranks this often after a rank fails (then the task retries)

    def __post_init__(self) -> None:  # checked with every other setting, before any stage runs
        problems = []
        if self.nnodes < 1:
            problems.append(f"nnodes must be >= 1, got {self.nnodes}")
        if self.node_rank is not None and not 0 <= self.node_rank < self.nnodes:
            problems.append(f"node_rank must lie in [0, nnodes={self.nnodes}), got {self.node_rank}")
        if not 1 <= self.master_port <= 65535:
            problems.append(f"master_port must be a TCP port (1 to 65535), got {self.master_port}")
        if self.max_restarts < 0:
            problems.append(f"max_restarts must be >= 0, got {self.max_restarts}")
        if problems:
            raise ValueError("rendezvous." + "; rendezvous.".join(problems))

    @property
    def torchrun_module(self) -> str:
        """One machine: torchrun with its stores on loopback (common.loopback_torchrun); several: torchrun."""
        return "common.loopback_torchrun" if self.nnodes == 1 else "torch.distributed.run"

    def torchrun_args(self, run_id: str | None = None) -> list[str]:
        restarts = [f"--max-restarts={self.max_restarts}"]
        if self.nnodes == 1:  # the rendezvous and the ranks' store on 127.0.0.1, a free port; nothing leaves the host
            return ["--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1",
                    f"--rdzv-id={run_id or uuid.uuid4().hex}", *restarts]
        if self.rdzv_endpoint:
            if not (self.rdzv_id or run_id):
                raise ValueError("a c10d rendezvous needs an id shared by the nodes of one run: set rdzv_id")
            return [f"--nnodes={self.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={self.rdzv_endpoint}",
                    f"--rdzv-id={self.rdzv_id or run_id}", *restarts]
        if self.node_rank is None or not self.master_addr:
            raise ValueError(
                f"nnodes={self.nnodes} needs either rdzv_endpoint (host:port of the c10d rendezvous) or "
                "node_rank and master_addr (static rendezvous)"
            )
        return [f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}", f"--master-addr={self.master_addr}",
                f"--master-port={self.master_port}", *restarts]


def visible_gpus() -> int:
    """GPUs this machine would give torchrun (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def torchrun_command(module: str, args: Sequence[str], nproc: int, rendezvous: Rendezvous = Rendezvous(),
                     run_id: str | None = None, python: str = sys.executable) -> list[str]:
    """`python -m torch.distributed.run ... -m module args` (the `torchrun` of `python`, by default this
    interpreter).

    Each rank runs as `common.lifetime python -m module`, so it dies with torchrun (layer 1 above).
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    return [python, "-m", rendezvous.torchrun_module, *rendezvous.torchrun_args(run_id),
            f"--nproc-per-node={nproc}", "-m", "common.lifetime", python, "-m", module, *args]


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


def _pump(stream, lines: queue.Queue) -> None:
    with stream:  # closed here, by its only reader, once the command's last writer has exited
        for line in stream:
            lines.put(line.rstrip("\n"))
    lines.put(None)


def run_streaming(
    cmd: Sequence[str],
    on_line: Callable[[str], None],
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    grace_s: float = KILL_GRACE_S,
) -> None:
    """Run `cmd`, calling `on_line` with each output line (stdout and stderr, merged) as it appears.

    Raises CommandFailed on a non-zero exit, Stopped when the flow run is being torn down. On any
    exception while waiting (timeout, cancellation, interrupt) the process group is killed before the
    exception propagates.
    """
    if _stopping.is_set():
        raise Stopped(f"not starting {' '.join(cmd)}: the flow run is ending")
    proc = subprocess.Popen(
        [sys.executable, "-m", "common.lifetime", *cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}, cwd=cwd, text=True,
        errors="replace", bufsize=1, start_new_session=True,
    )  # fmt: skip
    with _running_lock:
        _running.add(proc)
    output = ChildOutput()
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True, name="output-pump").start()
    try:
        while True:
            try:
                line = lines.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if line is None:
                break
            output.add(line)
            on_line(line)
        returncode = proc.wait()
    except BaseException:
        _kill_group(proc, grace_s)
        raise
    finally:
        with _running_lock:
            _running.discard(proc)
    if returncode != 0:
        # a worker may outlive a failed torchrun leader; leave nothing behind
        _kill_group(proc, grace_s=1.0)
        if _stopping.is_set():
            raise Stopped(f"{' '.join(cmd)} was stopped because its flow run is ending")
        raise CommandFailed(cmd, returncode, output.said())


@contextmanager
def stopped_with_flow_run(stop: Callable[[], None], what: str) -> Iterator[None]:
    """While the block runs, `stop_all` calls `stop` (e.g. cancels a Slurm job); refuse to start `what` when the
    flow run is already ending."""
    with _running_lock:
        if _stopping.is_set():
            raise Stopped(f"not starting {what}: the flow run is ending")
        _remote_stops.add(stop)
    try:
        yield
    finally:
        with _running_lock:
            _remote_stops.discard(stop)


def flow_run_ending() -> bool:
    """True once `stop_all` ran in this process: whatever fails now failed because it was stopped."""
    return _stopping.is_set()


def stop_all(grace_s: float = KILL_GRACE_S) -> None:
    """Kill every command this process is running (each group: SIGTERM, SIGKILL after `grace_s`) and stop every
    job registered with `stopped_with_flow_run`; start no more."""
    _stopping.set()
    with _running_lock:
        procs, remote_stops = list(_running), list(_remote_stops)
    for stop in remote_stops:
        stop()
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for proc in procs:
        _kill_group(proc, grace_s)


@contextmanager
def stop_children_on_exit() -> Iterator[None]:
    """Wrap a flow body: whatever exception ends it, no command it started survives it (layer 3 above).

    In a flow-run process started by a worker (PREFECT__FLOW_RUN_ID set), also have the kernel SIGTERM this
    process when the worker dies (layer 1), which Prefect turns into a termination: the run is marked Crashed.
    """
    from common.lifetime import die_with_parent

    if os.environ.get("PREFECT__FLOW_RUN_ID"):
        die_with_parent()
    _stopping.clear()
    try:
        yield
    except BaseException:
        stop_all()
        raise
