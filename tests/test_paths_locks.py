"""The path policy (common/paths.py) and the folder lock (common/locks.py) on their own, with real files, links
and processes: names are names, nothing resolves out of its folder (links at any level included), a second
writer is refused or waits with the holder named, a killed holder's lock is taken over, and the leftovers of
an interrupted write are removed by the next holder; readers share the lock, a writer waits for the last of
them (named) and a reader for a writer. Seconds."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from common.locks import FolderLocked, folder_lock, folder_read_lock
from common.paths import PathOutsideRoot, check_name, inside, listed_file, under
from tests.fixtures.processes import wait_for


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "/etc", "a\\b", "a\0b", "sm[o]ke", "*", "r?n", "x" * 256,
                                  "é" * 128])
def test_a_name_that_is_not_one_plain_component_is_refused_naming_the_setting(name):
    with pytest.raises(ValueError, match="^dataset must be a plain name"):
        check_name(name, "dataset")


def test_plain_names_pass():
    for name in ("smoke", "gpt2-124m", "fineweb10B", "a.b_c", "x" * 255):
        assert check_name(name, "dataset") == name


def test_a_link_at_any_level_that_leaves_root_is_refused(tmp_path):
    root, elsewhere = tmp_path / "artifacts", tmp_path / "elsewhere"
    (root / "runs").mkdir(parents=True)
    elsewhere.mkdir()
    assert under(root, "runs", "mine") == (root / "runs" / "mine").resolve()
    (root / "runs" / "linked").symlink_to(elsewhere)  # the last level
    with pytest.raises(PathOutsideRoot, match=f"resolves to {elsewhere}/?, outside {root}"):
        under(root, "runs", "linked")
    (root / "data").symlink_to(elsewhere)  # a level above the name
    with pytest.raises(PathOutsideRoot, match="outside"):
        under(root, "data", "smoke", "shards")
    (root / "eval").symlink_to(root / "runs")  # a link that stays inside root is fine
    assert under(root, "eval", "x") == (root / "runs" / "x").resolve()


def test_a_root_that_is_itself_a_link_is_the_users_choice(tmp_path):
    (tmp_path / "big-disk").mkdir()
    (tmp_path / "artifacts").symlink_to(tmp_path / "big-disk")
    assert under(tmp_path / "artifacts", "runs") == tmp_path / "big-disk" / "runs"


def test_files_listed_in_a_marker_stay_in_their_folder(tmp_path):
    folder = tmp_path / "step_00000010"
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"x")
    (folder / "leak").symlink_to("/etc/hostname")
    marker = folder / "COMPLETE"
    assert listed_file(folder, "model.bin", marker) == (folder / "model.bin").resolve()
    for name in ("/etc/hostname", "../COMPLETE", "sub/model.bin", "leak", 5, None):
        with pytest.raises(PathOutsideRoot, match=f"{marker} lists"):
            listed_file(folder, name, marker)


def test_inside_refuses_a_path_found_on_disk_that_leads_out(tmp_path):
    (tmp_path / "runs" / "run").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "runs" / "run" / "checkpoints").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PathOutsideRoot):
        inside(tmp_path / "runs" / "run" / "checkpoints", tmp_path / "runs")


# ---------------------------------------------------------------------------------------------------------
# the folder lock


HOLD = """
import sys, time
from common.locks import folder_lock, folder_read_lock
with (folder_read_lock if sys.argv[2] == "read" else folder_lock)(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(folder: Path, mode: str = "write") -> subprocess.Popen:
    """A process holding `folder`'s lock, as a writer or (mode "read") a reader, until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), mode], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_holders_lock_is_taken_over(tmp_path):
    holder = _holder(tmp_path / "shards")
    try:
        with pytest.raises(FolderLocked, match=f"{tmp_path / 'shards'} is being written by pid {holder.pid} on host"):
            with folder_lock(tmp_path / "shards"):
                pass
    finally:
        holder.kill()  # SIGKILL: no code of the holder runs; the kernel drops its flock
        holder.wait()
    with folder_lock(tmp_path / "shards"):
        assert json.loads((tmp_path / "shards" / "LOCK").read_text())["pid"] != holder.pid


def test_a_waiting_writer_is_told_who_holds_the_folder_and_runs_once_it_is_free(tmp_path):
    holder = _holder(tmp_path / "shards")
    told, entered = [], threading.Event()

    def second_writer():
        with folder_lock(tmp_path / "shards", wait=True, on_wait=told.append):
            entered.set()

    thread = threading.Thread(target=second_writer)
    thread.start()
    try:
        assert wait_for(lambda: told, 60)  # told once, while the holder keeps the lock
        assert not entered.is_set()
        assert told == [f"waiting for the lock: {tmp_path / 'shards'} is being written by pid {holder.pid} on host "
                        f"{json.loads((tmp_path / 'shards' / 'LOCK').read_text())['host']} "
                        f"(lock {tmp_path / 'shards' / 'LOCK'})"]
    finally:
        holder.kill()
        holder.wait()
    thread.join(timeout=60)
    assert entered.is_set()


def test_the_next_holder_removes_what_an_interrupted_write_left(tmp_path):
    folder = tmp_path / "init" / "checkpoints"
    (folder / ".tmp_step_00000000_4242").mkdir(parents=True)
    (folder / ".tmp_step_00000000_4242" / "state.safetensors").write_bytes(b"half")
    (folder / "manifest.json.4242.tmp").write_text("{")
    (folder / "step_00000000").mkdir()
    with folder_lock(tmp_path / "init", leftovers_in=[folder]):
        assert sorted(p.name for p in folder.iterdir()) == ["step_00000000"]


def test_a_link_planted_in_a_run_directory_is_refused_before_anything_is_written(tmp_path):
    from gpt2.run_dir import RunDir

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for planted in ("checkpoints", "metrics.jsonl", "tensorboard"):
        run = RunDir(tmp_path / "runs" / planted)
        run.root.mkdir(parents=True)
        (run.root / planted).symlink_to(elsewhere / planted)
        with pytest.raises(PathOutsideRoot, match=f"{run.root / planted} resolves to .*, outside {run.root}"):
            with run.lock():
                pass
        assert not (run.root / "LOCK").exists() and list(elsewhere.iterdir()) == []


def test_readers_share_the_lock_and_a_writer_waits_for_the_last_of_them_naming_it(tmp_path):
    """A tokenize rerun (a writer) while training and an evaluation read the shards (readers): refused or kept
    waiting, told who reads, until both are gone; a reader killed with SIGKILL holds nothing."""
    shards = tmp_path / "shards"
    shards.mkdir()
    training = _holder(shards, "read")
    evaluation = _holder(shards, "read")  # a second reader is not kept out by the first
    try:
        with pytest.raises(FolderLocked, match=rf"{shards} is being read by pid ({training.pid}|{evaluation.pid}) "
                                               r"on host \S+ and 1 more reader\(s\) \(lock "):
            with folder_lock(shards):
                pass
        told, entered = [], threading.Event()

        def rerun():
            with folder_lock(shards, wait=True, on_wait=told.append):
                entered.set()

        thread = threading.Thread(target=rerun)
        thread.start()
        assert wait_for(lambda: told, 60)
        evaluation.kill()
        evaluation.wait()
        with pytest.raises(FolderLocked, match=rf"{shards} is being read by pid {training.pid} on host \S+ \(lock "):
            with folder_lock(shards):
                pass
        assert not entered.is_set(), "the writer went in while a reader held the folder"
    finally:
        for reader in (training, evaluation):
            reader.kill()
            reader.wait()
    thread.join(timeout=60)
    assert entered.is_set()
    assert not (shards / "LOCK.readers").exists()  # the killed readers' files went with the writer's lock


def test_a_reader_waits_for_a_writer_and_is_told_who_writes(tmp_path):
    writer = _holder(tmp_path / "shards")
    told, entered = [], threading.Event()

    def reader():
        with folder_read_lock(tmp_path / "shards", on_wait=told.append):
            entered.set()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        assert wait_for(lambda: told, 60)
        assert not entered.is_set()
        assert told[0].startswith(f"waiting for the lock: {tmp_path / 'shards'} is being written by pid {writer.pid} ")
    finally:
        writer.kill()
        writer.wait()
    thread.join(timeout=60)
    assert entered.is_set()


def test_a_reader_of_a_read_only_or_missing_folder_reads_without_a_lock(tmp_path):
    """A read-only mount has no writer to exclude and a missing folder nothing to protect: the reader goes on
    (its own checks report a missing file), and nothing is created."""
    missing = tmp_path / "missing"
    with folder_read_lock(missing):
        pass
    assert not missing.exists()

    shards, mounted = tmp_path / "shards", tmp_path / "read-only"
    shards.mkdir()
    mounted.mkdir()
    (shards / "manifest.json").write_text("{}")
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", str(shards), str(mounted)]).returncode != 0:
        pytest.skip("a read-only bind mount needs root")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mounted)], check=True)
        with folder_read_lock(mounted):
            assert (mounted / "manifest.json").read_text() == "{}"
        assert sorted(p.name for p in shards.iterdir()) == ["manifest.json"]
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


# ---------------------------------------------------------------------------------------------------------
# a lock file is never written through a link


def _take(kind: str, folder: Path):
    """The lock `kind` of `folder`, as each of its takers takes it."""
    from gpt2.run_dir import RunDir

    return {"folder_lock": lambda: folder_lock(folder), "folder_read_lock": lambda: folder_read_lock(folder),
            "RunDir.lock": lambda: RunDir(folder).lock()}[kind]()


@pytest.mark.parametrize("kind", ["folder_lock", "folder_read_lock", "RunDir.lock"])
@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_a_lock_file_that_is_a_link_is_replaced_and_what_it_leads_to_is_left_alone(tmp_path, kind, link):
    """Before: `ln /tmp/victim.txt .../shards/LOCK`, then a writer wrote {"pid": ...} into the victim
    (O_NOFOLLOW stops symbolic links only)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    folder = tmp_path / "runs" / "linked"
    folder.mkdir(parents=True)
    (os.link if link == "hard" else os.symlink)(victim, folder / "LOCK")
    with _take(kind, folder):
        held = os.lstat(folder / "LOCK")
        assert stat.S_ISREG(held.st_mode) and held.st_nlink == 1, "the lock held is still the planted link"
        if kind != "folder_read_lock":
            assert json.loads((folder / "LOCK").read_text())["pid"] == os.getpid()
    assert victim.read_text() == "precious\n" and os.stat(victim).st_nlink == 1
    assert sorted(p.name for p in folder.iterdir() if p.name != "LOCK.readers") == ["LOCK"]  # no temporary left


def test_a_link_made_to_a_held_lock_does_not_let_a_second_writer_in(tmp_path):
    """A LOCK that gained a second name while a writer holds it is only replaced by whoever takes it next: a
    second writer meanwhile is still refused, naming the holder."""
    holder = _holder(tmp_path / "shards")
    try:
        os.link(tmp_path / "shards" / "LOCK", tmp_path / "another-name")
        with pytest.raises(FolderLocked, match=f"written by pid {holder.pid} on host"):
            with folder_lock(tmp_path / "shards"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with folder_lock(tmp_path / "shards"):
        assert os.lstat(tmp_path / "shards" / "LOCK").st_nlink == 1
    assert json.loads((tmp_path / "another-name").read_text())["pid"] == holder.pid  # the old file, not rewritten


def test_a_lock_file_that_is_a_directory_is_refused_naming_it(tmp_path):
    (tmp_path / "shards" / "LOCK").mkdir(parents=True)
    with pytest.raises(IsADirectoryError, match=f"{tmp_path / 'shards' / 'LOCK'} is a directory, not a lock file"):
        with folder_lock(tmp_path / "shards"):
            pass
