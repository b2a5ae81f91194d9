"""A second process shares a cold first step's builds. PoCL compiles one program at a time per
process, so on an empty kernel cache a TrainStep's first call spends its seconds compiling on one
core. At that call's first compile, a helper process starts (`python -m netcl.warmup --helper`):
it loads a copy of the model and walks the same training step dry (nothing built, nothing
launched) for the kernels it runs, then builds them last to first, skipping any another process
is building (netcl.runtime.program's claims: a program is built once, by whichever process gets
to it first; the other loads its binary). The first call builds first to last: the two meet in
the middle. Afterwards the helper builds the specialised kernels its background thread was
handed (at a lower priority) and exits; it is ended when this process exits.

Only on a CPU device of two or more cores whose binaries netcl keeps (enabled), for models the
.netcl format holds (a Sequential of registered layers); NETCL_BUILD_HELPER=0 turns it off (a
helper runs with it: it starts none)."""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager

from netcl.io.netcl_format import save
from netcl.runtime import buildlog, program

_children = []  # (Popen, folder) of the helpers started


def enabled(queue):
    """Whether a first call on `queue` may start a helper: NETCL_BUILD_HELPER=0 says never; else a
    CPU device (PoCL: its compiles are the seconds a first step waits; a GPU's driver compiles in
    a fraction of them) with two or more cores, whose binaries netcl keeps."""
    import pyopencl as cl

    if os.environ.get("NETCL_BUILD_HELPER", "").strip() == "0":
        return False
    device = queue.device
    return bool(device.type & cl.device_type.CPU) and device.max_compute_units >= 2 and program.keeps_binaries(device)


@contextmanager
def first_call(step, xt, tt):
    """Around TrainStep `step`'s first call of a shape (input xt, target tt): the helper starts at
    this process's first compile within it, if ever."""
    if not enabled(xt.queue):
        yield
        return
    offer = _Offer(step, xt, tt)
    program.on_compile.append(offer)
    try:
        yield
    finally:
        program.on_compile.remove(offer)


class _Offer:
    def __init__(self, step, xt, tt):
        self.step, self.xt, self.tt, self.started = step, xt, tt, False

    def __call__(self):
        if self.started or buildlog.in_background():
            return
        self.started = True
        try:
            _start(self.step, self.xt, self.tt)
        except (TypeError, ValueError, OSError) as e:  # a model the format does not hold, a full disk: no helper
            buildlog.log.debug("no build helper: %s", e)


def _start(step, xt, tt):
    folder = tempfile.mkdtemp(prefix="netcl-helper-")
    try:
        save(step.model, os.path.join(folder, "model.netcl"))
        target = tt.to_host()
        spec = {"x": list(xt.shape), "target": list(target.shape), "loss": type(step.loss_fn).__name__,
                "optimizer": type(step.optimizer).__name__, "hyper": step.optimizer.hyperparameters(),
                "device": xt.queue.device.name.strip()}
        with open(os.path.join(folder, "spec.json"), "w") as f:
            json.dump(spec, f)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    env = dict(os.environ, NETCL_BUILD_HELPER="0", NETCL_QUIET="1", NETCL_DEVICE=spec["device"])
    child = subprocess.Popen([sys.executable, "-m", "netcl.warmup", "--helper", folder], env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not _children:
        atexit.register(_end)
    _children.append((child, folder))
    buildlog.log.debug("build helper started (pid %d)", child.pid)


def _end():
    """End the helpers still running (their half-built programs are taken over by the next build:
    program's claims name their builder's PID) and remove what they left."""
    for child, folder in _children:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
        shutil.rmtree(folder, ignore_errors=True)
