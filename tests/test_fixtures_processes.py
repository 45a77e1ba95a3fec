"""The suite's own process helpers (tests/fixtures/processes.py), where what they promise is not already
exercised by the end-to-end tests that use them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.processes import lower_priority


def _autogroup_niceness(pid: int | str) -> int | None:
    """The niceness of the process's autogroup ("/autogroup-123 nice 0"), or None where the CPU is not shared by
    autogroups: a kernel without them (no file), or a process whose CPU share a cgroup sets (an empty file)."""
    try:
        _, _, niceness = Path(f"/proc/{pid}/autogroup").read_text().split()
    except (FileNotFoundError, ValueError):
        return None
    return int(niceness)


@pytest.mark.skipif(_autogroup_niceness("self") is None, reason="no autogroups here: niceness alone ranks processes")
def test_lower_priority_lowers_a_training_in_its_own_session_and_never_the_suites():
    """A training launched by a flow run has a session of its own, and Linux shares the CPU between sessions
    before it looks at a process's niceness: lowering the process alone would leave it a whole share."""
    own = _autogroup_niceness("self")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    elsewhere = subprocess.Popen(sleeper, start_new_session=True)
    here = subprocess.Popen(sleeper)
    try:
        lower_priority([elsewhere.pid, here.pid], 19)
        assert os.getpriority(os.PRIO_PROCESS, elsewhere.pid) == 19
        assert _autogroup_niceness(elsewhere.pid) == 19, "the other session's group kept its share of the CPU"
        assert os.getpriority(os.PRIO_PROCESS, here.pid) == 19
        assert _autogroup_niceness(here.pid) == _autogroup_niceness("self") == own, "the suite's session was lowered"
    finally:
        for process in (elsewhere, here):
            process.kill()
            process.wait()


def test_stop_all_refuses_new_commands_for_the_rest_of_its_test():
    """`stop_all` (a failed flow's teardown, called in this process) makes `tasks.launch` refuse new commands..."""
    from tasks.launch import flow_run_ending, stop_all

    stop_all()
    assert flow_run_ending()


def test_the_next_test_starts_commands_again():
    """...until this process's test ends (tests/conftest.py): the test after it starts commands again."""
    from tasks.launch import flow_run_ending

    assert not flow_run_ending()
