"""Devices and NETCL_DEVICE selection, the errors (no device, failed build), the on-disk kernel
cache across processes, and Tensor's host/device round trip."""
import hashlib
import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import netcl
from netcl import CompileError, NoDeviceError, Tensor
from netcl.runtime import build, program, select_device
from netcl.runtime import device as device_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_devices_lists_the_selected_device(queue):
    devs = netcl.devices()
    assert devs and all(d.type in ("gpu", "cpu", "accelerator", "other") for d in devs)
    assert [d.index for d in devs] == list(range(len(devs)))
    assert any(d.name == queue.device.name.strip() for d in devs)
    assert all(d.name in str(d) for d in devs)


def test_netcl_device_selects_by_type_and_name(queue, monkeypatch):
    devs = netcl.devices()
    pairs = device_module._all_devices()
    cpu = next((d for d, (_, dev) in zip(devs, pairs) if d.type == "cpu" and not d.name.startswith(
        device_module.SERIAL_PREFIXES) and device_module.compile_error(dev) is None), None)
    if cpu is not None:
        monkeypatch.setenv("NETCL_DEVICE", "cpu")
        assert select_device().name.strip() == cpu.name
        monkeypatch.setenv("NETCL_DEVICE", cpu.name[:6].upper())  # a case-insensitive substring
        assert select_device().name.strip() == cpu.name
    monkeypatch.setenv("NETCL_DEVICE", "no-such-device-xyz")
    with pytest.raises(NoDeviceError, match="no-such-device-xyz") as e:
        select_device()
    assert devs[0].name in str(e.value)  # the message lists what there is
    monkeypatch.delenv("NETCL_DEVICE")
    gpus = [d for d in devs if d.type == "gpu"]
    assert select_device().name.strip() == (gpus[0] if gpus else cpu).name  # default: first GPU, else CPU
    if not gpus:
        with pytest.raises(NoDeviceError, match="gpu"):
            select_device("gpu")
    assert netcl.default_queue() is netcl.default_queue()  # one queue per device per process


def test_no_platform_raises_no_device_error_with_install_hint(monkeypatch):
    import pyopencl as cl

    def no_platforms():
        raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    for fake in (no_platforms, lambda: []):
        monkeypatch.setattr(cl, "get_platforms", fake)
        with pytest.raises(NoDeviceError, match="pocl") as e:
            netcl.devices()
        assert "pip install pocl-binary-distribution" in str(e.value)
    monkeypatch.setitem(sys.modules, "pyopencl", None)  # pyopencl not installed at all
    with pytest.raises(NoDeviceError, match="pip install pyopencl"):
        device_module.select_device()


class _FakePlatform:
    def __init__(self, ptr, name="Portable Computing Language", vendor="The pocl project"):
        self.int_ptr, self.name, self.vendor, self.version = ptr, name, vendor, f"OpenCL 3.0 {name} {ptr}"


class _FakeDevice:
    def __init__(self, ptr, platform, name, kind):
        import pyopencl as cl

        self.int_ptr, self.platform, self.name = ptr, platform, name
        self.type = getattr(cl.device_type, kind)


def test_selection_takes_the_first_platform_whose_device_builds(monkeypatch):
    """Two PoCLs (PyPI's 3.0 beside Debian's 3.1, as `make` installs on a CPU LLVM 14 does not
    know): by type, by default or by a name both match, the first device that passes netcl's
    probe; where the one chosen (alone, or none passing) fails it, a NoDeviceError that
    says what to install, but select_device(probe=False) chooses as before (the first)."""
    p1, p2 = _FakePlatform(1), _FakePlatform(2)
    old, new = _FakeDevice(11, p1, "pthread-AMD EPYC", "CPU"), _FakeDevice(21, p2, "pthread-skylake-avx512-AMD EPYC", "CPU")
    serial = _FakeDevice(22, p2, "basic-skylake-avx512-AMD EPYC", "CPU")
    monkeypatch.delenv("NETCL_DEVICE", raising=False)
    monkeypatch.setattr(device_module, "_all_devices", lambda: [(p1, old), (p2, serial), (p2, new)])
    broken = {11}
    probed = []

    def fake_error(d):
        probed.append(d.int_ptr)
        return "error: unknown target CPU 'generic'" if d.int_ptr in broken else None

    monkeypatch.setattr(device_module, "compile_error", fake_error)
    for spec in (None, "cpu", "PTHREAD"):
        assert select_device(spec) is new, spec
    assert select_device("basic") is serial  # one match
    # named alone, a PoCL CPU device whose kernels would abort the process is refused, saying why
    with pytest.raises(NoDeviceError, match="pthread-AMD EPYC .*cannot run netcl's kernels.*pocl-opencl-icd"):
        select_device("pthread-AMD")
    assert select_device("pthread-AMD", probe=False) is old  # `netcl devices --check` lists it all the same
    broken.add(21)
    with pytest.raises(NoDeviceError, match="unknown target CPU"):
        select_device()  # none passes
    assert select_device(probe=False) is old  # the first
    monkeypatch.setattr(device_module, "_all_devices", lambda: [(p1, old)])
    broken.clear()
    probed.clear()
    assert select_device() is old and probed == [11]  # one platform: its PoCL CPU device probed too
    gpu = _FakeDevice(31, _FakePlatform(3, "NVIDIA CUDA", "NVIDIA Corporation"), "NVIDIA H200", "GPU")
    monkeypatch.setattr(device_module, "_all_devices", lambda: [(gpu.platform, gpu), (p1, old)])
    probed.clear()
    assert select_device() is gpu and probed == []  # other drivers' devices are not probed


def test_probe_and_the_unknown_cpu_hint(queue):
    assert device_module.compile_error(queue.device) is None
    assert "pocl-opencl-icd" in program._hint("error: unknown target CPU 'generic'")
    assert program._hint("error: use of undeclared identifier") == ""


def test_probe_runs_in_a_child_and_keeps_its_verdict_on_disk(queue, monkeypatch, tmp_path):
    """The probe (float16 fma, fmax, exp) runs in a child process, where an LLVM abort cannot take
    netcl's process down; its verdict is read back from the cache folder, not probed again."""
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(device_module, "_probed", {})
    children = []
    real = device_module._probe_in_child
    monkeypatch.setattr(device_module, "_probe_in_child", lambda d: children.append(d) or real(d))
    assert device_module.compile_error(queue.device) is None and len(children) == 1
    path = device_module.probe_path(queue.device)
    assert open(path).read() == "ok"
    monkeypatch.setattr(device_module, "_probed", {})
    assert device_module.compile_error(queue.device) is None and len(children) == 1  # from disk
    with open(path, "w") as f:  # a damaged verdict is probed again (and rewritten), never taken as one
        f.write("o")
    monkeypatch.setattr(device_module, "_probed", {})
    assert device_module.compile_error(queue.device) is None and len(children) == 2
    assert open(path).read() == "ok"
    # a failed verdict (as PyPI's PoCL 3.0 on a Zen 4 gives) is reported with what to do about it
    with open(path, "w") as f:
        f.write("error\nthe probe kernels (float16 fma, fmax, exp) failed in a child process (killed by SIGABRT)")
    monkeypatch.setattr(device_module, "_probed", {})
    err = device_module.compile_error(queue.device)
    assert "killed by SIGABRT" in err and "pocl-opencl-icd" in program._hint(err)


def test_probe_without_a_cache_folder_still_probes(queue, monkeypatch, tmp_path):
    (tmp_path / "a_file").write_text("")  # the cache folder cannot be made under a file
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "a_file" / "cache"))
    monkeypatch.setattr(device_module, "_probed", {})
    assert device_module.compile_error(queue.device) is None


def test_probe_child_that_cannot_find_the_device_leaves_it_to_a_build_here(queue):
    class Platform:
        name, version = "no such platform", "0"

    class Device:
        name, platform = "no such device", Platform()

    assert device_module._probe_in_child(Device()) == ""  # "": the in-process build decides
    assert device_module._build_here(queue.device) is None


def test_probe_child_without_pyopencl_is_no_verdict(queue, monkeypatch, tmp_path):
    """An interpreter that cannot import pyopencl (an embedded Python's sys.executable) says
    nothing of the device: "" (the in-process build decides), never a failed probe."""
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S -I "$@"\n')  # no site-packages: no numpy
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    assert device_module._probe_in_child(queue.device) == ""


def test_a_kernel_missing_from_its_program_is_a_compile_error(queue, monkeypatch):
    class Empty:
        def all_kernels(self):
            return []

    import netcl.runtime as rt

    monkeypatch.setattr(rt, "build", lambda *a, **k: Empty())
    ks = rt.kernels(queue, "act_cpu", ("-DNETCL_TEST_EMPTY=1",))
    with pytest.raises(CompileError, match="no kernel 'act_fwd_cpu' in act_cpu.cl built with -DNETCL_TEST_EMPTY=1"):
        ks["act_fwd_cpu"]


def test_failed_build_raises_compile_error_with_log(queue):
    src = "__kernel void broken(__global float *x) { x[0] = undeclared_thing; }"
    with pytest.raises(CompileError) as e:
        build(queue.context, src)
    assert "undeclared_thing" in e.value.log  # the compiler's own words
    assert "undeclared_thing" in str(e.value)


_CHILD = textwrap.dedent("""
    import json, sys, time
    import netcl
    from netcl.runtime import build, program
    q = netcl.default_queue()
    t = time.perf_counter()
    prog = build(q.context, sys.argv[1])
    print(json.dumps(dict(program.stats, seconds=time.perf_counter() - t,
                          kernels=[k.function_name for k in prog.all_kernels()])))
""")


_LAUNCH_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import netcl
    from netcl import Tensor, ops
    q = netcl.default_queue()
    x = Tensor.from_host(q, np.arange(64, dtype=np.float32))
    ops.launch(q, "convtrain_cpu", "sum_chunks_cpu", (1,), (1,), 16, 2, x, x, 0)
    print(x.to_host()[:2].tolist())
""")


def test_a_kernel_from_the_binary_cache_launches_without_compiling(queue, tmp_path):
    """A PoCL binary in netcl's cache holds the work-group function its launches run (specialised to
    a work-item a work-group: program.POCL_SPECIALISE): a second process with netcl's cache but an
    empty PoCL cache launches the kernel with the function from the binary (PoCL's debug log says
    which it used, and that it built none). NETCL_BINARY_CACHE=0 keeps no binaries."""
    version = queue.device.platform.version
    if "pocl" not in (queue.device.platform.name + queue.device.platform.vendor).lower() or "POCL_DEBUG" not in version:
        pytest.skip("PoCL's work-group functions, seen through its debug log")
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    env = {k: v for k, v in os.environ.items() if k not in ("POCL_BINARY_SPECIALIZE_WG", "NETCL_BINARY_CACHE")}
    env.update(NETCL_CACHE_DIR=str(tmp_path / "netcl"), PYTHONPATH=path, POCL_DEBUG="general")

    def child(pocl_cache):
        (tmp_path / pocl_cache).mkdir(exist_ok=True)
        out = subprocess.run([sys.executable, "-c", _LAUNCH_CHILD], env=dict(env, POCL_CACHE_DIR=str(tmp_path / pocl_cache)),
                             capture_output=True, text=True, check=True, timeout=300)
        said = [ln for ln in out.stderr.splitlines() if "sum_chunks_cpu" in ln and "WG function" in ln]
        return out.stdout.strip().splitlines()[-1], said

    first, said = child("pocl1")
    assert len(list((tmp_path / "netcl").glob("*.bin"))) == 1
    second, said = child("pocl2")
    assert second == first
    assert said and all("Using a cached WG function" in ln and program.POCL_SPECIALISE in ln for ln in said), said
    for value, keeps in (("1", True), ("0", False)):
        os.environ["NETCL_BINARY_CACHE"] = value
        try:
            assert program.keeps_binaries(queue.device) is keeps
        finally:
            del os.environ["NETCL_BINARY_CACHE"]


def test_disk_cache_hit_in_a_second_process(queue, tmp_path):
    # a source no cache has seen (PoCL's own cache included): a fresh token in a comment
    src = f"// {os.urandom(8).hex()}\n" + "__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }\n"
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)  # keep site dirs of the caller
    env = dict(os.environ, NETCL_CACHE_DIR=str(tmp_path), PYTHONPATH=path)

    def child():
        out = subprocess.run([sys.executable, "-c", _CHILD, src], env=env, capture_output=True, text=True,
                             check=True, timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = child()
    assert (first["compiled"], first["disk"], first["kernels"]) == (1, 0, ["twice"])
    assert len(list(tmp_path.glob("*.bin"))) == 1
    second = child()
    assert (second["compiled"], second["disk"], second["kernels"]) == (0, 1, ["twice"])
    # a whole entry whose binary the driver refuses (another driver's) is rebuilt from source
    (entry,) = tmp_path.glob("*.bin")
    foreign = b"not a device binary"
    entry.write_bytes(program._ENTRY.pack(program._MAGIC, len(foreign), hashlib.sha256(foreign).digest()) + foreign)
    third = child()
    assert (third["compiled"], third["disk"], third["damaged"]) == (1, 0, 0)
    assert entry.read_bytes() != b"not a device binary"


def _flip(b, i):
    return b[:i] + bytes([b[i] ^ 0x10]) + b[i + 1:]


DAMAGE = {  # what a crash, a full disk or a bad sector leaves of an entry; each crashed PoCL before
    "truncated to half": lambda b: b[:len(b) // 2],
    "truncated to its header": lambda b: b[:program._ENTRY.size],
    "truncated to 10 bytes": lambda b: b[:10],
    "empty": lambda b: b"",
    "a byte flipped in the binary": lambda b: _flip(b, len(b) // 2),
    "the last byte flipped": lambda b: _flip(b, len(b) - 1),
    "a length that disagrees": lambda b: b[:8] + struct.pack("<Q", len(b)) + b[16:],
    "a bare binary (the old format)": lambda b: b[program._ENTRY.size:],
}


def test_a_damaged_cache_entry_is_rebuilt_and_rewritten_never_loaded(queue, tmp_path):
    """Damage the entry between processes: the next process detects it (length, checksum),
    compiles from source and rewrites a whole entry, which the process after it loads."""
    src = f"// {os.urandom(8).hex()}\n" + "__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }\n"
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, NETCL_CACHE_DIR=str(tmp_path), PYTHONPATH=path)

    def child():  # check=True: a driver crash (SIGSEGV) fails the test
        out = subprocess.run([sys.executable, "-c", _CHILD, src], env=env, capture_output=True, text=True,
                             check=True, timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert child()["compiled"] == 1
    (entry,) = tmp_path.glob("*.bin")
    good = entry.read_bytes()
    magic, length, digest = program._ENTRY.unpack_from(good)
    assert (magic, length, digest) == (program._MAGIC, len(good) - program._ENTRY.size,
                                       hashlib.sha256(good[program._ENTRY.size:]).digest())
    for name, damage in DAMAGE.items():
        entry.write_bytes(damage(good))
        got = child()
        assert (got["damaged"], got["compiled"], got["disk"], got["kernels"]) == (1, 1, 0, ["twice"]), name
        rewritten = entry.read_bytes()
        assert program._read_entry(entry) == rewritten[program._ENTRY.size:], name  # whole again
    got = child()
    assert (got["damaged"], got["compiled"], got["disk"]) == (0, 0, 1)
    left = [p.name for p in tmp_path.iterdir() if not p.name.startswith("probe-")]  # (device probes' verdicts)
    assert left == [entry.name]  # no temporary files left


def test_tensor_round_trip(queue):
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    t = Tensor.from_host(queue, x)
    assert t.shape == (2, 3) and t.on_device
    h = t.to_host()
    assert h.dtype == np.float32
    np.testing.assert_array_equal(h, x)
    h[0, 0] = 99  # to_host returns a copy
    assert t.to_host()[0, 0] == 0
    x[0, 1] = 99  # from_host copies too
    assert t.to_host()[0, 1] == 1
    host_only = Tensor.from_host(None, [[1, 2], [3, 4]])
    assert host_only.queue is None and not host_only.on_device
    np.testing.assert_array_equal(host_only.to(queue).to_host(), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(Tensor.from_host(queue, np.array([True, False])).to_host(), [1, 0])
    assert Tensor.from_host(queue, np.zeros((0, 3))).shape == (0, 3)


@pytest.mark.parametrize("bad", ["abc", None, {"a": 1}, [[1, 2], [3]], np.array([object()]), [1 + 2j],
                                 np.array(["1.0"])])
def test_from_host_rejects_non_numeric_input(queue, bad):
    with pytest.raises(TypeError, match="float32"):
        Tensor.from_host(queue, bad)


def test_every_kernel_declares_its_scalar_argument_types(queue):
    """runtime.kernels types each kernel's scalar arguments from its signature (a launch then packs
    them without inspecting values); the signature parse must cover every argument of every kernel."""
    import glob
    import os

    from netcl import tuning
    from netcl.runtime import arg_dtypes, kernel_source, kernels

    for path in sorted(glob.glob(os.path.join(os.path.dirname(netcl.__file__), "kernels", "*.cl"))):
        family = os.path.basename(path)[:-3]
        if family.startswith("conv_") or family.startswith("linear"):
            continue  # the fused families are built by netcl.jit with their -D defines
        types = arg_dtypes(kernel_source(family))
        options = {"gemm": ("-DBM=64", "-DBN=64", "-DBK=16", "-DRM=4", "-DRN=4", "-DA_KMAJOR=1", "-DB_KMAJOR=0"),
                   "gemm_cpu": tuple(f"-D{k}={v}" for k, v in tuning.values("gemm_cpu", "cpu16").items())}.get(family, ())
        ks = kernels(queue, family, options)
        for name in ks:
            try:
                k = ks[name]
            except CompileError:  # only a kernel inside an #if can be left out by the options
                assert ks.split.kernels[name][2].cond, (family, name)
                continue
            assert len(types[name]) == k.num_args, (family, name)


_USERS_QUEUE = """
import gc, sys
import numpy as np
import netcl
from netcl import nn, optim
q = netcl.default_queue()
gc.collect()  # nothing here holds the context: netcl must
sys.path.insert(0, sys.argv[1])
from test_runtime import linear_step_and_predict
linear_step_and_predict(q)
print("ok")
"""


def linear_step_and_predict(q):
    """An SGD step of a Linear on MSE and a predict after it, through queue `q`, against float64 numpy."""
    from netcl import nn, optim

    rng = np.random.default_rng(7)
    x, t = rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(5, 3))
    lin = nn.Linear(4, 3).to(q)
    w, b = lin.weight.to_host().astype(np.float64), lin.bias.to_host().astype(np.float64)
    model, loss_fn = nn.Sequential(lin), nn.MSELoss()
    opt = optim.SGD(model.parameters(), lr=0.1)
    model.train()
    loss = loss_fn(model(Tensor.from_host(q, x)), t)
    model.backward(loss_fn.backward())
    opt.step()
    y = x.astype(np.float64) @ w + b  # netcl's Linear weight is (in, out)
    np.testing.assert_allclose(loss, np.mean((y - t) ** 2), rtol=1e-5)
    dy = 2 * (y - t) / y.size
    w, b = w - 0.1 * x.T @ dy, b - 0.1 * dy.sum(0)
    np.testing.assert_allclose(model.eval().predict(x, q), x @ w + b, rtol=1e-5, atol=1e-6)


def test_the_default_queue_keeps_its_context():
    """netcl's own queue outlives every reference a caller holds to its context (Intel's OpenCL
    destroys an unreferenced context under its queues: the first upload was INVALID_CONTEXT)."""
    r = subprocess.run([sys.executable, "-c", _USERS_QUEUE, os.path.dirname(os.path.abspath(__file__))],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_queues_whose_context_the_caller_does_not_keep(queue):
    """A queue over netcl's context made from a temporary runs netcl; a queue over a Context nobody
    keeps (cl.CommandQueue(cl.Context([dev]))) runs it where the implementation keeps a queue's
    context alive (PoCL), and is a ValueError saying what to do where it does not (Intel's)."""
    import pyopencl as cl

    linear_step_and_predict(cl.CommandQueue(queue.context, queue.device))
    bare = cl.CommandQueue(cl.Context([queue.device]))
    try:
        bare.context
    except cl.LogicError:
        with pytest.raises(ValueError, match="keep the pyopencl.Context"):
            netcl.runtime.alloc(bare, 64)
        return
    linear_step_and_predict(bare)
