"""Replacing a file atomically: readers see the old file or the complete new one, never a part.

    with AtomicFile(path, "save") as f:    # f: a binary file object
        f.write(data)                      # an exception here leaves `path` as it was
"""
import contextlib
import os
import secrets


class AtomicFile:
    """A new file that takes the place of `path` only on commit().

    The bytes go to `.<name>.<pid>-<random>.tmp` in the target's folder (same file system, so the
    rename is atomic), created exclusively (O_EXCL: never someone else's file). commit() flushes
    and fsyncs it, renames it over `path` and fsyncs the folder, so that the rename itself survives
    a crash; discard() removes it. Until the rename an existing `path` is untouched, and after any
    failure no temporary file is left. As a context manager it commits on a clean exit and discards
    on an exception. verb names the operation in error messages ("cannot save to ...").
    """

    def __init__(self, path, verb="write"):
        self.path = os.fspath(path)
        self.folder = os.path.dirname(os.path.abspath(self.path))
        if os.path.isdir(self.path):
            raise IsADirectoryError(f"cannot {verb} to {self.path!r}: it is a directory; give a file name")
        if not os.path.isdir(self.folder):
            raise FileNotFoundError(f"cannot {verb} to {self.path!r}: folder {self.folder!r} does not exist")
        name = f".{os.path.basename(self.path)}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        self.tmp = os.path.join(self.folder, name)
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        self.f = os.fdopen(fd, "wb")
        self._open = True  # the temporary file exists and is ours

    def commit(self):
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
