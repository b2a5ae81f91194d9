"""What a user sees while kernels compile: nothing for a moment, then lines through `logging`.

Builds come in bursts (a model's first step builds a few dozen programs, each well under a second
on PoCL, then nothing). Once a burst has taken BURST_S seconds, the "netcl" logger says so at INFO,
then names each kernel family as the burst first builds one, and sums the burst up when it ends
(no build for GAP_S seconds). Where no handler is configured for it (nor above it), netcl adds one
that writes "netcl: ..." to stderr; NETCL_QUIET=1 turns these lines into DEBUG records. Compiler
chatter (PoCL's build log, its "1 warning generated." lines on stderr) goes to DEBUG records
only: program.build captures the standard error stream while a build runs (quiet_stderr)."""
import logging
import os
import re
import sys
import tempfile
import threading
import time
from contextlib import contextmanager

log = logging.getLogger("netcl")
BURST_S, GAP_S = 2.0, 3.0
_lock = threading.Lock()
# what a compiler writes: diagnostics and clang's summary line
_COMPILER = re.compile(rb"(?:error|warning|note): |\d+ (?:warnings?|errors?)(?: and \d+ \w+)? generated")
_fd_lock = threading.Lock()  # one build at a time redirects file descriptor 2
_fd_guard = threading.Lock()  # held while _saved_fd changes or is written to
_saved_fd = None  # while a build redirects descriptor 2: a descriptor of where it pointed before


class _Handler(logging.StreamHandler):
    """netcl's own stderr handler: its lines reach the terminal while a build holds descriptor 2."""

    def emit(self, record):
        with _fd_guard:
            if _saved_fd is not None:
                try:
                    os.write(_saved_fd, (self.format(record) + "\n").encode(errors="replace"))
                except OSError:
                    pass
                return
        self.setStream(sys.stderr)
        super().emit(record)


class _Burst:
    def __init__(self, device):
        self.device, self.start, self.last_end = device, time.monotonic(), None
        self.count, self.seconds, self.spoken, self.families, self.current = 0, 0.0, False, set(), None
        self.active = 0  # builds running now


_burst = None


def quiet():
    """Whether NETCL_QUIET (1, true, yes, on) hides the build progress lines; read per call."""
    return os.environ.get("NETCL_QUIET", "").strip().lower() in ("1", "true", "yes", "on")


def say(message):
    """`message` at INFO on the "netcl" logger (DEBUG under NETCL_QUIET=1), with a stderr handler
    added first where nothing would show it."""
    if quiet():
        log.debug(message)
        return
    if not log.hasHandlers():
        handler = _Handler(sys.stderr)
        handler.setFormatter(logging.Formatter("netcl: %(message)s"))
        log.addHandler(handler)
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)
    log.info(message)


class _Thread(threading.local):
    background = False  # this thread builds for netcl.runtime.tiers


_thread = _Thread()
_last_foreground = [None, 0]  # when the foreground's last build ended (monotonic), builds running now


@contextmanager
def background():
    """Builds in the block are the background thread's (netcl.runtime.tiers): DEBUG lines only,
    and they do not keep the background waiting (busy_within)."""
    _thread.background = True
    try:
        yield
    finally:
        _thread.background = False


def in_background():
    """Whether this thread builds for netcl.runtime.tiers (background())."""
    return _thread.background


def touch():
    """The foreground made a program now (loaded one: PoCL loads take the lock its compiles hold)."""
    if not _thread.background:
        with _lock:
            _last_foreground[0] = time.monotonic()


def busy_within(seconds):
    """Whether a foreground build runs now, or one ended, or the foreground loaded a program, less
    than `seconds` ago."""
    with _lock:
        last, running = _last_foreground
    return running > 0 or (last is not None and time.monotonic() - last < seconds)


@contextmanager
def building(family, what, device=""):
    """Around one program build: `family` (the kernel file's name), `what` (its kernel and options,
    for the lines)."""
    global _burst
    if _thread.background:
        t = time.perf_counter()
        try:
            yield
        finally:
            log.debug("built %s in the background in %.2f s", what, time.perf_counter() - t)
        return
    with _lock:
        _last_foreground[1] += 1
        now = time.monotonic()
        b = _burst
        if b is None or (b.active == 0 and b.last_end is not None and now - b.last_end > GAP_S):
            if b is not None:
                _summary(b)
            b = _burst = _Burst(device)
            timer = threading.Timer(BURST_S, _announce, (b,))
            timer.daemon = True
            timer.start()
        b.active += 1
        b.current = what
        if b.spoken and family not in b.families:
            say(f"building {what}")
        b.families.add(family)
    t = time.perf_counter()
    try:
        yield
    finally:
        spent = time.perf_counter() - t
        with _lock:
            b.active -= 1
            b.count += 1
            b.seconds += spent
            b.last_end = time.monotonic()
            _last_foreground[:] = [b.last_end, _last_foreground[1] - 1]
        log.debug("built %s in %.2f s", what, spent)
        timer = threading.Timer(GAP_S + 0.1, _maybe_end, (b,))
        timer.daemon = True
        timer.start()


def _announce(b):
    with _lock:
        if b is not _burst or b.spoken:
            return
        if b.active == 0 and (b.last_end is None or time.monotonic() - b.last_end > GAP_S):
            return  # over before it took BURST_S
        b.spoken = True
        where = f" for {b.device}" if b.device else ""
        now = f"; now {b.current}" if b.current else ""
    say(f"compiling OpenCL kernels{where}: each once, kept in the kernel cache for later runs "
        f"(NETCL_QUIET=1 hides these lines){now}")


def _maybe_end(b):
    global _burst
    with _lock:
        if b is not _burst or b.active or b.last_end is None or time.monotonic() - b.last_end < GAP_S:
            return
        _burst = None
    _summary(b)


def _summary(b):
    if b.spoken:
        say(f"built {b.count} kernel program{'s' * (b.count != 1)} in {b.seconds:.1f} s "
            f"({time.monotonic() - b.start:.1f} s with the first launches' compiles)")


@contextmanager
def quiet_stderr(captured):
    """Standard error (file descriptor 2, where PoCL's compiler writes) into a file while the block
    runs; its text is appended to the list `captured` afterwards. Python's own sys.stderr writes in
    the meantime land there too (one build at a time holds the descriptor) and go back to stderr
    afterwards unless the compiler wrote there too; netcl's log lines are not redirected."""
    global _saved_fd
    with _fd_lock:
        try:
            sys.stderr.flush()
        except (AttributeError, ValueError, OSError):
            pass
        try:
            saved = os.dup(2)
        except OSError:  # no descriptor 2 to redirect (a daemon): nothing reaches a user
            yield
            return
        with tempfile.TemporaryFile() as f:
            with _fd_guard:
                os.dup2(f.fileno(), 2)
                _saved_fd = saved
            try:
                yield
            finally:
                f.seek(0)
                text = f.read()
                with _fd_guard:
                    os.dup2(saved, 2)
                    _saved_fd = None
                    os.close(saved)
                if text and not _COMPILER.search(text):  # another thread's, not the compiler's: back to stderr
                    try:
                        os.write(2, text)
                    except OSError:
                        pass
                else:
                    captured.append(text.decode(errors="replace"))
