"""netcl.io.atomic.AtomicFile, the one writer behind save(), save_checkpoint() and export_onnx():
all or nothing, durable, and never a damaged target."""
import fcntl
import os
import stat
import subprocess
import sys

import pytest

from netcl.io import atomic
from netcl.io.atomic import AtomicFile


def listing(folder):
    return sorted(os.listdir(folder))


def test_commit_replaces_the_target_and_makes_the_rename_durable(tmp_path, monkeypatch):
    target = tmp_path / "m.bin"
    target.write_bytes(b"old")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)), real_fsync(fd)))
    with AtomicFile(target) as f:
        f.write(b"new")
        assert target.read_bytes() == b"old"  # untouched until the rename
    assert target.read_bytes() == b"new" and listing(tmp_path) == ["m.bin"]
    assert synced == [False, True]  # the file's data, then the folder (the rename itself)


def test_the_temporary_file_is_named_after_the_target_and_the_process(tmp_path):
    af = AtomicFile(tmp_path / "m.onnx")
    name = os.path.basename(af.tmp)
    assert os.path.dirname(af.tmp) == str(tmp_path)
    assert name.startswith(f".m.onnx.{os.getpid()}-") and name.endswith(".tmp")
    af.discard()
    assert listing(tmp_path) == []


def test_an_error_inside_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "m.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="midway"):
        with AtomicFile(target) as f:
            f.write(b"half")
            raise RuntimeError("midway")
    assert target.read_bytes() == b"old" and listing(tmp_path) == ["m.bin"]


def test_a_failed_rename_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    target = tmp_path / "m.bin"
    target.write_bytes(b"old")
    af = AtomicFile(target)
    af.f.write(b"new")
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("rename failed")))
    with pytest.raises(OSError, match="rename failed"):
        af.commit()
    assert target.read_bytes() == b"old" and listing(tmp_path) == ["m.bin"]
    af.discard()  # nothing left to do, and no error


def test_it_never_opens_an_existing_file_as_its_temporary_one(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic.secrets, "token_hex", lambda n: "cafe")
    squatter = tmp_path / f".m.bin.{os.getpid()}-cafe.tmp"
    squatter.write_bytes(b"someone else's")
    with pytest.raises(FileExistsError):
        AtomicFile(tmp_path / "m.bin")
    assert squatter.read_bytes() == b"someone else's"


def test_bad_targets_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(IsADirectoryError, match="cannot save to .*it is a directory"):
        AtomicFile(tmp_path, "save")
    with pytest.raises(FileNotFoundError, match="cannot export to .*does not exist"):
        AtomicFile(tmp_path / "no" / "m.onnx", "export")
    assert listing(tmp_path) == []


def test_commit_twice_is_an_error(tmp_path):
    af = AtomicFile(tmp_path / "m.bin")
    af.commit()
    with pytest.raises(ValueError, match="already committed"):
        af.commit()


def dead_pid():
    """The PID of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_of_dead_writers_are_removed_and_nothing_else(tmp_path):
    dead = dead_pid()
    stale = [tmp_path / f".m.bin.{dead}-0badf00d.tmp", tmp_path / f".m.bin.{2**31 - 1}-00000000.tmp"]
    kept = [tmp_path / f".m.bin.{os.getpid()}-0000beef.tmp",  # a live writer (another thread of this process)
            tmp_path / f".other.bin.{dead}-0badf00d.tmp",  # another target's
            tmp_path / f".m.bin.{dead}-xyz.tmp", tmp_path / "m.bin.bak", tmp_path / f"m.bin.{dead}-0badf00d.tmp"]
    for p in stale + kept:
        p.write_bytes(b"partial")
    (tmp_path / f".m.bin.{dead}-0000cafe.tmp").mkdir()  # not a file: left alone
    with AtomicFile(tmp_path / "m.bin") as f:
        f.write(b"new")
    assert not any(p.exists() for p in stale)
    assert all(p.read_bytes() == b"partial" for p in kept)
    assert (tmp_path / "m.bin").read_bytes() == b"new"


def test_a_locked_temporary_is_a_live_writer_even_when_its_pid_is_not_here(tmp_path):
    # a writer on another machine sharing the folder (or behind a reused PID) holds its file's lock
    other = tmp_path / f".m.bin.{dead_pid()}-0badf00d.tmp"
    other.write_bytes(b"being written")
    with open(other, "rb+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        AtomicFile(tmp_path / "m.bin").commit()
        assert other.read_bytes() == b"being written"
    af = AtomicFile(tmp_path / "m.bin")  # once the lock is gone (its writer died) the file is stale
    assert not other.exists()
    # and a live writer's own temporary file is locked while it writes
    with open(af.tmp, "rb+") as probe, pytest.raises(BlockingIOError):
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    af.discard()


@pytest.mark.parametrize("path, error, message", [
    ("", ValueError, "the path is empty"),
    (b"m.bin", TypeError, "got bytes; decode it with os.fsdecode"),
    (3, TypeError, "path must be a str or os.PathLike, got int"),
    ("no-such-folder/", IsADirectoryError, "give a file name"),
])
def test_paths_that_name_no_file_are_refused_and_nothing_is_written(tmp_path, monkeypatch, path, error, message):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(error, match=message):
        AtomicFile(path, "save")
    assert listing(tmp_path) == ["work"] and listing(work) == []
