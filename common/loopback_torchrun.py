"""`python -m common.loopback_torchrun ARGS...`: torchrun (`torch.distributed.run ARGS...`) for one machine, its
TCP stores listening on 127.0.0.1 only.

torchrun's launcher hosts two TCP stores (the c10d rendezvous and the store its ranks bootstrap from), and a
store that serves binds every interface whatever address it is given; anyone who can reach the machine could
read and write it, without authentication. On one machine nothing outside needs them, so here each serving
store is handed a socket already listening on 127.0.0.1 (TCPStore's `master_listen_fd`). The caller passes
loopback addresses for the rendezvous (`--rdzv-endpoint=127.0.0.1:0 --local-addr=127.0.0.1`, see
tasks.launch.Rendezvous), so every client connects there, and gloo's own sockets stay on the loopback interface
too (GLOO_SOCKET_IFNAME, unless set). No prefect import: this runs on GPU hosts.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import torch.distributed as dist

LOOPBACK = "127.0.0.1"
_TCPStore = dist.TCPStore


class LoopbackTCPStore(_TCPStore):
    """A TCPStore whose server, if it is one, listens on 127.0.0.1 only (port 0: a free one)."""

    def __init__(self, host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
                 *args: Any, **kwargs: Any):
        if is_master and kwargs.get("master_listen_fd") is None:
            listener = socket.create_server((LOOPBACK, port), backlog=socket.SOMAXCONN)
            port = listener.getsockname()[1]
            kwargs["master_listen_fd"] = listener.detach()  # the store's from now on
        super().__init__(host_name, port, world_size, is_master, *args, **kwargs)


def _use_loopback_stores() -> None:
    """Every TCPStore torchrun creates from here on is a LoopbackTCPStore, also where a module imported it by name."""
    dist.TCPStore = LoopbackTCPStore
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("torch.distributed") and getattr(module, "TCPStore", None) is _TCPStore:
            module.TCPStore = LoopbackTCPStore


def main() -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the ranks' gloo pairs: loopback too
    _use_loopback_stores()
    from torch.distributed.run import main as torchrun

    torchrun(sys.argv[1:])


if __name__ == "__main__":
    main()
