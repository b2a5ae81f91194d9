"""Replacing a file atomically: readers see the old file or the complete new one, never a part.

    with AtomicFile(path, "save") as f:    # f: a binary file object
        f.write(data)                      # an exception here leaves `path` as it was
"""
import contextlib
import os
import re
import secrets

try:
    import fcntl  # POSIX: a writer holds a lock on its temporary file while it lives
except ImportError:
    fcntl = None


def file_path(path, verb="write"):
    """`path` (a str or an os.PathLike giving one) as a str, or a clear error: an empty path would
    name the current folder, and bytes paths are refused (decode them with os.fsdecode)."""
    try:
        p = os.fspath(path)
    except TypeError:
        raise TypeError(f"cannot {verb}: path must be a str or os.PathLike, got {type(path).__name__}") from None
    if not isinstance(p, str):
        raise TypeError(f"cannot {verb} to {p!r}: path must be a str (or os.PathLike giving one), got "
                        f"{type(p).__name__}; decode it with os.fsdecode()")
    if not p:
        raise ValueError(f"cannot {verb}: the path is empty; give a file name")
    return p


class AtomicFile:
    """A new file that takes the place of `path` only on commit().

    The bytes go to `.<name>.<pid>-<random>.tmp` in the target's folder (same file system, so the
    rename is atomic), created exclusively (O_EXCL: never someone else's file) and locked while
    being written. Temporaries of the same target left by writers that died (a kill -9 midway)
    are removed first: only those whose PID is no longer alive and whose lock nobody holds. commit() flushes
    and fsyncs it, renames it over `path` and fsyncs the folder, so that the rename itself survives
    a crash; discard() removes it. Until the rename an existing `path` is untouched, and after any
    failure no temporary file is left. As a context manager it commits on a clean exit and discards
    on an exception. verb names the operation in error messages ("cannot save to ...").
    """

    def __init__(self, path, verb="write"):
        self.path = file_path(path, verb)
        self.folder = os.path.dirname(os.path.abspath(self.path))
        if os.path.isdir(self.path) or not os.path.basename(self.path):
            raise IsADirectoryError(f"cannot {verb} to {self.path!r}: it is a directory; give a file name")
        if not os.path.isdir(self.folder):
            raise FileNotFoundError(f"cannot {verb} to {self.path!r}: folder {self.folder!r} does not exist")
        base = os.path.basename(self.path)
        remove_stale(self.folder, base)
        self.tmp = os.path.join(self.folder, f".{base}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        if fcntl:
            with contextlib.suppress(OSError):  # a file system without locks: the PID check still guards
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.f = os.fdopen(fd, "wb")
        self._open = True  # the temporary file exists and is ours

    def commit(self):
        """Flush, sync and rename the temporary file onto `path` (and sync the folder): the file
        appears whole or not at all. ValueError if already committed or discarded."""
        if not self._open:
            raise ValueError(f"{self.path!r}: the temporary file was already committed or discarded")
        try:
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self.discard()
            raise
        self._open = False
        with contextlib.suppress(OSError):  # make the rename durable (POSIX; a folder cannot be opened on Windows)
            fd = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def discard(self):
        """Remove the temporary file; nothing once committed or discarded."""
        if not self._open:
            return
        self._open = False
        with contextlib.suppress(OSError):  # never hide the error that brought us here
            self.f.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)

    def __enter__(self):
        return self.f

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.discard()


def remove_stale(folder, base):
    """Remove `.<base>.<pid>-<hex>.tmp` files in `folder` whose writer is dead: its PID is not a
    live process here and nobody holds the file's lock (the lock also covers a writer on another
    machine sharing the folder, or a PID reused since). Anything else is left alone. POSIX only:
    elsewhere neither the PID check nor the lock is available without side effects."""
    if fcntl is None:
        return
    pattern = re.compile(rf"\.{re.escape(base)}\.([0-9]{{1,10}})-[0-9a-f]{{8}}\.tmp")
    try:
        with os.scandir(folder) as entries:
            stale = [e.path for e in entries if (m := pattern.fullmatch(e.name)) and not _alive(int(m[1]))
                     and e.is_file(follow_symlinks=False)]
    except OSError:  # an unreadable folder: nothing to clean, and the write itself will say why
        return
    for tmp in stale:
        with contextlib.suppress(OSError):  # gone already, not ours to open, or locked by a live writer
            fd = os.open(tmp, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(tmp)
            finally:
                os.close(fd)


def _alive(pid):
    """Whether process `pid` exists (signal 0 tests without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    except OverflowError:  # not a PID this system can have
        return False
    return True
