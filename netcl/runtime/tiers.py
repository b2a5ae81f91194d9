"""Two tiers of kernels: the generic ones a layer can run at any size, and those specialised to one
layer's sizes (conv_winot.cl's Winograd, a first layer's one-launch weight gradient), which cost
seconds each to build on a CPU's OpenCL (PoCL). A layer whose specialised kernels are not built yet
(not in this process, not in the kernel cache) runs its generic route and hands them to
build_later(); one background thread builds them, one at a time, while the foreground builds
nothing (the foreground's first steps build their generic kernels first: PoCL compiles one program
at a time per process). When the queue drains, generation() moves on: a layer decides its route
anew (Conv2d.route), and a replayed TrainStep records again (its guard compares generations).
The thread also builds generic kernels that another input size or width would take where this one
does not (BatchNorm2d's statistics kernels), so that the new shape finds them built.

NETCL_COMPILE=eager builds the specialised kernels before the first step that runs them (the same
launches from the first step on: benchmarks, the tests); background (the default) as above.
compile_model and `netcl warmup` build everything a model needs ahead of time (eager for their
duration: with_mode)."""
import atexit
import os
import threading
import time
from contextlib import contextmanager

from netcl.runtime import buildlog

MODES = ("background", "eager")
IDLE_S = 1.0  # the foreground has built nothing for this long: the background may build
_lock = threading.Condition()
_pending = []  # (queue, family, name, options), oldest first
_queued = set()  # their keys: (context int_ptr, family, name, options)
_generation = [0]
_worker = []  # the thread, once started
_forced = []  # with_mode's stack
_building = [False]  # the thread is inside a build
_stopping = [False]  # the interpreter exits: the thread builds nothing more
builder = None  # (queue, family, kernel, options) -> the built kernel: netcl.runtime sets it (runtime.kernels)


def mode():
    """The compile mode: with_mode's, else $NETCL_COMPILE ("background" when unset), read per call."""
    if _forced:
        return _forced[-1]
    text = os.environ.get("NETCL_COMPILE", "").strip().lower()
    if not text:
        return "background"
    if text not in MODES:
        raise ValueError(f"NETCL_COMPILE must be one of {', '.join(MODES)}, got {text!r}")
    return text


@contextmanager
def with_mode(which):
    """Run the block in compile mode `which` (one of MODES), whatever NETCL_COMPILE says."""
    if which not in MODES:
        raise ValueError(f"compile mode must be one of {', '.join(MODES)}, got {which!r}")
    _forced.append(which)
    try:
        yield
    finally:
        _forced.pop()


def generation():
    """How many times the background builds have drained (each time, routes may change)."""
    return _generation[0]


def pending():
    """The kernels waiting for the background thread, or being built by it."""
    with _lock:
        return len(_pending)


class NotReady(Exception):
    """(Raised where only built programs may be used, ready_only()) this program is not built yet."""


class _ReadyOnly(threading.local):
    on = False


_ready_only = _ReadyOnly()


@contextmanager
def ready_only():
    """In the block, netcl.jit's builds of a program not built yet raise NotReady (the fused
    inference path then runs the layers' own kernels and builds its plan with build_later_call)."""
    was, _ready_only.on = _ready_only.on, True
    try:
        yield
    finally:
        _ready_only.on = was


def only_ready():
    """Whether this thread is inside ready_only(): builds then raise NotReady instead of compiling."""
    return _ready_only.on


def build_later_call(key, fn):
    """Hand fn() (a build of several programs: a fused plan's for one input shape) to the
    background thread, once per key."""
    with _lock:
        if key in _queued:
            return
        _queued.add(key)
        _pending.append((None, fn, None, None))
        _start()
        _lock.notify_all()


def build_later(queue, kernels):
    """Hand (family, kernel, options) triples to the background thread (each once)."""
    with _lock:
        for family, name, options in kernels:
            key = (queue.context.int_ptr, family, name, tuple(options))
            if key not in _queued:
                _queued.add(key)
                _pending.append((queue, family, name, tuple(options)))
        _start()
        _lock.notify_all()


def _start():
    if _pending and not _worker:
        t = threading.Thread(target=_work, name="netcl-kernel-builds", daemon=True)
        _worker.append(t)
        atexit.register(_stop)
        t.start()


def _stop():
    """(At exit) drop what waits, and let a build in flight finish: the interpreter must not end
    while the thread is inside the compiler (PoCL aborted the process then)."""
    with _lock:
        _stopping[0] = True
        del _pending[1 if _building[0] else 0:]
        end = time.monotonic() + 60
        while _building[0] and time.monotonic() < end:
            _lock.wait(0.5)


def settle(timeout=None):
    """Wait until the background thread has built everything handed to it (True), or `timeout`
    seconds have passed (False)."""
    end = None if timeout is None else time.monotonic() + timeout
    with _lock:
        while _pending:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            _lock.wait(left if left is not None else 1.0)
    return True


def _work():
    while True:
        with _lock:
            while not _pending and not _stopping[0]:
                _lock.wait()
            if _stopping[0]:
                return
            q, family, name, options = _pending[0]
        while buildlog.busy_within(IDLE_S) and not _stopping[0]:  # the foreground builds: it goes first
            time.sleep(0.05)
        with _lock:
            if _stopping[0]:
                return
            _building[0] = True
        try:
            with buildlog.background():
                if q is None:  # build_later_call's
                    family()
                else:
                    builder(q, family, name, options)
        except Exception as e:  # the foreground builds it again when it runs it, and raises there
            buildlog.log.debug("background build of %s %s failed: %s", family, name, e)
        with _lock:
            _building[0] = False
            if _pending:
                _pending.pop(0)
            if not _pending:
                _generation[0] += 1
            _lock.notify_all()
