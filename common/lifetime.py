"""Child processes that die with their parent, even when the parent is killed by SIGKILL.

Linux's prctl(PR_SET_PDEATHSIG) asks the kernel to signal a process when the thread that forked it
exits. Nothing in the parent has to run for it, so it covers what no handler can: a parent killed by
SIGKILL, the OOM killer, a crashed worker. The pipeline's process chain uses it on every link:

    Prefect worker -> flow engine -> torchrun -> gpt2.train ranks

- the flow engine sets it on itself when it starts (flows.pipeline), so a dying worker takes it along;
- torchrun is started through this module, `python -m common.lifetime CMD...`, which sets it and then
  execs CMD (the death signal survives exec, and the pid stays the same);
- each rank is started by torchrun the same way (tasks.launch.torchrun_command), because torchrun puts
  its workers in sessions of their own, out of reach of a signal to torchrun's process group.

The signal is SIGTERM: torchrun forwards it to its ranks and the engine turns it into Prefect's
termination (the flow run is marked Crashed). No prefect import: this runs on GPU hosts.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when its parent exits; exit now if it already has.

    A no-op off Linux (no prctl); the launcher's process-group kill still covers the graceful paths.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent died before the request took effect: nobody will signal us
        os.kill(os.getpid(), sig)


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m common.lifetime CMD [ARGS...]\n\n"
              "Run CMD (exec'd in place) so that it receives SIGTERM when this process's parent exits.")
        sys.exit(0 if argv else 2)
    die_with_parent()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
