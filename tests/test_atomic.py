"""netcl.io.atomic.AtomicFile, the one writer behind save(), save_checkpoint() and export_onnx():
all or nothing, durable, and never a damaged target."""
import os
import stat

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
