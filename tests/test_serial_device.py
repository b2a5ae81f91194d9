"""Small predict() calls on PoCL's serial CPU device (netcl.runtime.serial_queue, FusedPlan.infer):
which calls go there, that they give the threaded device's results exactly, that threads are safe
(PoCL 3's serial driver deadlocked with four threads before the lock), the switches, and
Module.macs, which sizes a call, against PyTorch's FLOP counter."""
import os
import subprocess
import sys

import numpy as np
import pytest

from netcl import models, nn, runtime
from netcl.nn.module import ShapeError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def serial(q):
    s = runtime.serial_queue(q)
    if s is None:
        pytest.skip("no PoCL serial CPU device next to the default device")
    return s


def _keys(model):
    return {qp for qp, _ in model._fused._exe}


# -- Module.macs ---------------------------------------------------------------------------------
def _torch_macs(module, *shapes, **kw):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc, torch.no_grad():
        module(*[torch.zeros(s) for s in shapes], **kw)
    return fc.get_total_flops() // 2


def test_macs_match_torch_flop_counter():
    torch = pytest.importorskip("torch")
    tn = torch.nn
    cases = [  # (netcl layer, torch layer, input shape)
        (nn.Conv2d(3, 8, 3, padding=1), tn.Conv2d(3, 8, 3, padding=1), (2, 3, 10, 9)),
        (nn.Conv2d(8, 16, 5, stride=2, padding=2, dilation=1), tn.Conv2d(8, 16, 5, stride=2, padding=2), (1, 8, 17, 12)),
        (nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8), tn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8),
         (3, 8, 7, 7)),
        (nn.Conv2d(8, 12, 1, groups=4), tn.Conv2d(8, 12, 1, groups=4), (1, 8, 5, 5)),
        (nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1),
         tn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1), (2, 6, 5, 7)),
        (nn.Linear(20, 7), tn.Linear(20, 7), (3, 5, 20)),
    ]
    for ours, theirs, shape in cases:
        assert ours.macs(shape) == _torch_macs(theirs, shape), ours
    mha, tmha = nn.MultiheadAttention(32, 4), tn.MultiheadAttention(32, 4, batch_first=True)
    shape = (2, 10, 32)
    assert mha.macs(shape) == _torch_macs(tmha, shape, shape, shape, need_weights=True)  # the bmm path counts all


def test_macs_of_blocks_add_their_parts():
    body = [nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)]
    short = nn.Conv2d(4, 8, 1, stride=2)
    model = nn.Sequential(nn.Residual(*body, shortcut=short), nn.Concat(nn.Identity(), nn.Conv2d(8, 2, 1)),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(10, 3))
    x = (2, 4, 12, 12)
    want = (2 * 8 * 6 * 6 * 4 * 9) + (2 * 8 * 6 * 6 * 8 * 9) + (2 * 8 * 6 * 6 * 4) + (2 * 2 * 6 * 6 * 8) + 2 * 3 * 10
    assert model.macs(x) == want
    assert nn.ReLU().macs((3, 4)) == 0 and nn.BatchNorm2d(4).macs((1, 4, 2, 2)) == 0
    assert models.resnet8().macs((1, 3, 32, 32)) == 12_501_632
    with pytest.raises(ShapeError, match=r"layer 0\.body\.0") as e:
        model.macs((2, 5, 12, 12))  # the layer path, as output_shape names it
    assert "4 input channels" in str(e.value)


# -- which device ---------------------------------------------------------------------------------
def test_selection_never_picks_the_serial_device_by_type(serial, monkeypatch):
    assert runtime.is_serial(serial.device)
    monkeypatch.delenv("NETCL_DEVICE", raising=False)
    assert not runtime.is_serial(runtime.select_device())
    assert not runtime.is_serial(runtime.select_device("cpu"))
    assert runtime.select_device(serial.device.name.strip()[:5]) == serial.device  # by name it may be chosen
    assert runtime.serial_queue(serial) is None  # the serial device has no twin of its own


def test_a_serial_device_alone_on_its_platform_is_a_cpu(monkeypatch):
    """By type ("cpu", the default) the serial device is passed over only beside its own platform's
    threaded device: a user's POCL_DEVICES=basic next to a GPU still has a CPU."""
    from types import SimpleNamespace as NS

    from netcl.runtime import device as dv

    pocl = NS(name="Portable Computing Language", vendor="The pocl project", int_ptr=1)
    other_pocl = NS(name="Portable Computing Language", vendor="The pocl project", int_ptr=3)
    nv = NS(name="NVIDIA CUDA", vendor="NVIDIA Corporation", int_ptr=2)
    basic = NS(name="basic-Intel(R) Xeon(R)", platform=pocl, kind="cpu")
    pthread = NS(name="pthread-Intel(R) Xeon(R)", platform=pocl, kind="cpu")
    other = NS(name="pthread-Intel(R) Xeon(R)", platform=other_pocl, kind="cpu")
    gpu = NS(name="NVIDIA H200", platform=nv, kind="gpu")
    monkeypatch.setattr(dv, "_type_name", lambda d: d.kind)
    monkeypatch.setattr(dv, "compile_error", lambda d: None)  # all build (test_runtime: one that does not)
    monkeypatch.delenv("NETCL_DEVICE", raising=False)
    monkeypatch.setattr(dv, "_all_devices", lambda: [(pocl, basic), (nv, gpu)])
    assert dv.select_device("cpu") is basic and dv.select_device() is gpu
    monkeypatch.setattr(dv, "_all_devices", lambda: [(pocl, basic), (pocl, pthread), (nv, gpu)])
    assert dv.select_device("cpu") is pthread and dv.select_device("basic") is basic
    monkeypatch.setattr(dv, "_all_devices", lambda: [(pocl, basic), (other_pocl, other)])
    assert dv.select_device() is basic  # another platform's threaded device does not pass it over
    monkeypatch.setattr(dv, "_all_devices", lambda: [(pocl, basic), (pocl, pthread)])
    assert dv.select_device() is pthread


@pytest.mark.parametrize("value,bound", [("", 30_000_000), ("1", 30_000_000), ("1.0", 30_000_000), ("0", 0),
                                         ("0.0", 0), ("-1", 0), ("5e7", 50_000_000), ("  2000 ", 2000)])
def test_netcl_cpu_serial_values(value, bound):
    assert runtime.serial_bound(value) == bound


@pytest.mark.parametrize("value", ["fast", "inf", "nan", "1e400", "on"])
def test_netcl_cpu_serial_bad_values(value):
    with pytest.raises(ValueError, match="NETCL_CPU_SERIAL=.*expected 0 \\(off\\), 1"):
        runtime.serial_bound(value)


def test_a_layer_calling_an_eval_model_inside_the_turn(q, serial):
    """A layer the fused path does not fuse may call another eval model: inside predict()'s turn on
    the serial device that model takes the same (re-entrant) lock instead of waiting on itself."""
    class Wrap(nn.Module):
        def __init__(self, inner):
            super().__init__()
            object.__setattr__(self, "inner", inner)  # another model it calls, not a layer it holds

        def output_shape(self, shape):
            return self.inner.output_shape(shape)

        def forward(self, x):
            return self.inner(x)

    inner = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU()).eval()
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), Wrap(inner), nn.Flatten()).eval()
    x = np.random.default_rng(3).normal(size=(1, 3, 8, 8)).astype(np.float32)
    assert model._fused.unfused() == ["Wrap"]
    assert np.array_equal(model.predict(x), model.predict(x, q))
    assert serial.int_ptr in _keys(model)


def test_plans_with_unfused_parameters_stay_on_the_threaded_device(q, serial):
    """A layer the plan does not fuse runs its own forward on the call's device; one with parameters
    (ConvTranspose2d) would carry them to the serial device's context and back, call after call."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.ConvTranspose2d(4, 2, 2, stride=2)).eval()
    x = np.random.default_rng(4).normal(size=(1, 3, 8, 8)).astype(np.float32)
    assert model._fused.unfused() == ["ConvTranspose2d"] and model.macs(x.shape) < runtime.SERIAL_MACS
    model.predict(x)
    assert _keys(model) == {q.int_ptr} and model[2].weight.queue is q


def test_small_calls_run_on_the_serial_device_with_the_same_results(q, serial, monkeypatch):
    rng = np.random.default_rng(0)
    model = models.resnet8().eval()
    x1 = rng.normal(size=(1, 3, 32, 32)).astype(np.float32)
    x4 = rng.normal(size=(4, 3, 32, 32)).astype(np.float32)  # 50 M multiply-accumulates: the threaded device
    monkeypatch.delenv("NETCL_CPU_SERIAL", raising=False)
    y1, y4 = model.predict(x1), model.predict(x4)
    assert _keys(model) == {serial.int_ptr, q.int_ptr}
    assert np.array_equal(y1, model.predict(x1, q))  # the same kernels on the same CPU: bit for bit
    assert np.array_equal(y4, model.predict(x4, serial))
    model._fused._exe.clear()
    monkeypatch.setenv("NETCL_CPU_SERIAL", "6e7")  # a larger bound takes batch 4 too
    model.predict(x4)
    assert _keys(model) == {serial.int_ptr}
    model._fused._exe.clear()
    monkeypatch.setenv("NETCL_CPU_SERIAL", "0")  # off
    model.predict(x1)
    assert _keys(model) == {q.int_ptr} and runtime.serial_queue(q) is None
    monkeypatch.setenv("NETCL_CPU_SERIAL", "fast")
    with pytest.raises(ValueError, match="NETCL_CPU_SERIAL='fast': expected 0"):
        model.predict(x1)
    with pytest.raises(ValueError, match="NETCL_CPU_SERIAL='fast'"):
        runtime.serial_queue(q)


def test_a_shape_that_does_not_fit_gives_the_layers_error(serial):
    model = models.resnet8().eval()
    with pytest.raises(ValueError, match="3 input channels"):
        model.predict(np.zeros((1, 4, 32, 32), np.float32))
    assert model.predict(np.zeros((0, 3, 32, 32), np.float32)).shape == (0, 10)


_THREADS = """
import threading, numpy as np, netcl
from netcl import models, runtime
q = netcl.default_queue()
serial = runtime.serial_queue(q)
rng = np.random.default_rng(1)
netcl.manual_seed(1)
shared = models.resnet8().eval()
own = [models.resnet8().eval() for _ in range(4)]
xs = [rng.normal(size=(1 + i % 2, 3, 32, 32)).astype(np.float32) for i in range(4)]
refs = [shared.predict(x, q) for x in xs]
own_refs = [m.predict(xs[0], q) for m in own]
wrong, errors = [], []

def worker(t):
    try:
        for j in range(600):
            if not np.array_equal(own[t].predict(xs[0]), own_refs[t]):
                wrong.append(("own", t))
            if j % 3 == 0:
                i = (t + j) % len(xs)
                if not np.array_equal(shared.predict(xs[i]), refs[i]):
                    wrong.append(("shared", i))
    except Exception as e:
        errors.append(repr(e))

def explicit(t):  # the serial device's queue given by the caller: the same turns
    try:
        for j in range(300):
            if not np.array_equal(own[t].predict(xs[0], serial), own_refs[t]):
                wrong.append(("explicit", t))
    except Exception as e:
        errors.append(repr(e))

for target in (worker, explicit):
    pool = [threading.Thread(target=target, args=(t,)) for t in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
assert serial is not None and serial.int_ptr in {k for k, _ in shared._fused._exe}
print("wrong", len(wrong), "errors", errors[:1])
"""


def test_threads_on_the_serial_device_get_their_own_results(serial):
    """Four threads, one shared model and one model each, predict() without a queue, in a process
    of their own: PoCL 3's serial driver deadlocked here (holding the GIL) when two threads' commands
    met in its queue, before the lock; a hang fails the test at the timeout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "gen")]))
    try:
        out = subprocess.run([sys.executable, "-c", _THREADS], env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("four threads calling predict() hung on the serial device")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["wrong", "0", "errors", "[]"], out.stdout


# -- the process-wide switch (PoCL reads POCL_DEVICES once per process) ---------------------------------
def _devices_in_fresh_process(**env):
    code = ("import os, netcl; names = [d.name for d in netcl.devices()]; "
            "assert os.environ.get('POCL_DEVICES') == " + repr(env.get("POCL_DEVICES")) + ", 'left set'; "
            "print('|'.join(names))")
    full = {k: v for k, v in os.environ.items() if k not in ("POCL_DEVICES", "NETCL_CPU_SERIAL")}
    full.update(env, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "gen")]))
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split("|")


def test_netcl_asks_pocl_for_the_serial_device_unless_told_not_to(serial):
    assert any(n.startswith(runtime.device.SERIAL_PREFIXES) for n in _devices_in_fresh_process())
    assert not any(n.startswith(runtime.device.SERIAL_PREFIXES) for n in _devices_in_fresh_process(NETCL_CPU_SERIAL="0"))
    names = _devices_in_fresh_process(POCL_DEVICES="pthread")  # the user's POCL_DEVICES wins
    assert not any(n.startswith(runtime.device.SERIAL_PREFIXES) for n in names)
