"""Finding 12: single-node training must not open its rendezvous to the network.

A real torchrun, started with the command the train stage uses (tasks.launch.torchrun_command), two ranks on
gloo; while they are up, every listening socket of the launcher and its ranks is read from /proc/net/tcp{,6}.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tasks.launch import torchrun_command
from tests.fixtures.processes import descendants, listening_addresses, wait_for

REPO = Path(__file__).resolve().parent.parent
LOOPBACK = {"127.0.0.1", "::1"}


def test_single_node_torchrun_listens_on_loopback_only(tmp_path):
    command = torchrun_command("tests.fixtures.dist_hold", [str(tmp_path)], nproc=2, run_id="loopback")
    launcher = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    try:
        ready = wait_for(lambda: sorted(tmp_path.glob("ready*")), 300)
        assert len(ready) == 2, "the two ranks did not join their process group"
        assert all(p.read_text().endswith(" 2") for p in ready)  # the all-reduce went through
        listening = listening_addresses(descendants(launcher.pid))
        stores = listening_addresses({launcher.pid})
        assert len(stores) >= 1, f"the launcher hosts its rendezvous store: {listening}"
        assert [a for a in listening if a[0] not in LOOPBACK] == [], f"listening beyond loopback: {listening}"
        (tmp_path / "release").touch()
        output, _ = launcher.communicate(timeout=120)
        assert launcher.returncode == 0, output[-3000:]
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
