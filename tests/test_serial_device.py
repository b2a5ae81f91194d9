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
