"""Kernels that load whole vectors past a row's last column (gemm_cpu's narrow B panels, gemm_cpu_thin's,
head_cpu.cl's rows of W, gemm_cpu_dot's grouped blocks, gemm_cpu_nt's tails, wgrad_narrow_cpu's rows,
wgrad_oc16_cpu's blocks) never read or write past their operand: each operand ends exactly before a page the
process may not touch (PoCL's CPU device uses a CL_MEM_USE_HOST_PTR buffer as the host memory itself), so one
float too far is a segfault. The cases run in a child process, whose crash is this test's failure."""
import os
import subprocess
import sys

import pytest

from netcl import ops

CHILD = r'''
import ctypes, mmap, sys
import numpy as np
import pyopencl as cl
import netcl
from netcl import Tensor, nn, ops, tuning

libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
keep = []


def guarded(q, arr):
    """A device Tensor of arr whose last byte is the last before an unreadable page."""
    arr = np.ascontiguousarray(arr, np.float32)
    nbytes, page = max(arr.nbytes, 4), mmap.PAGESIZE
    pages = -(-nbytes // page) + 1
    m = mmap.mmap(-1, (pages + 1) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    assert libc.mprotect(base + pages * page, page, 0) == 0
    host = np.frombuffer((ctypes.c_char * nbytes).from_address(base + pages * page - nbytes), np.float32)
    host[:arr.size] = arr.reshape(-1)
    buf = cl.Buffer(q.context, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, hostbuf=host)
    keep.append((m, host, buf))
    return Tensor(arr.shape, q, buf=buf)


q = netcl.default_queue()
rng = np.random.default_rng(0)
for config in ("cpu", "cpu16"):
    ops._config_class = {q.device.int_ptr: config}
    ops._cpu_plans.clear()
    cut = tuning.values("gemm_cpu_cutoffs", config)
    for thin_k in (8, 0):  # K <= 8: gemm_cpu_thin's tail vectors, then gemm_cpu's narrow panels for all
        cut["thin_k"] = thin_k
        for M, N, K in [(5, 1, 7), (9, 3, 40), (19, 10, 300), (4, 15, 5), (8, 10, 1), (70, 21, 3)]:  # B rows
            a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
            got = ops.matmul(guarded(q, a), guarded(q, b)).to_host()
            assert np.allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4), (config, M, N, K)
    cut["thin_k"] = 8
    # both operands k-rows: dot blocks, grouped along n; gemm_cpu_nt (rows, columns and k in tails)
    for M, N, K in [(10, 150, 128), (13, 21, 71), (32, 150, 128), (45, 21, 203)]:
        a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((N, K)).astype(np.float32)
        got = ops.matmul(guarded(q, a), guarded(q, b), trans_b=True).to_host()
        assert np.allclose(got, a.astype(np.float64) @ b.T, rtol=1e-4, atol=1e-4), (config, M, N, K)
ops._config_class = {}
for n, inputs, classes in [(3, 1, 1), (2, 7, 3), (5, 33, 10), (1, 17, 16), (4, 2, 15)]:
    lin = nn.Linear(inputs, classes)
    w = rng.standard_normal((inputs, classes)).astype(np.float32)
    lin.weight = nn.Parameter(guarded(q, w))  # (a Parameter on the guarded buffer)
    lin.bias = nn.Parameter(guarded(q, np.zeros(classes, np.float32)))
    x = rng.standard_normal((n, inputs)).astype(np.float32)
    labels = guarded(q, rng.integers(0, classes, n).astype(np.float32))
    logits, pending, dx = nn.CrossEntropyLoss().enqueue_linear(lin, guarded(q, x), labels)
    assert np.allclose(logits.to_host(), x.astype(np.float64) @ w, rtol=1e-4, atol=1e-5), (n, inputs, classes)
    pending.item()
for n, c, oh, ow, oc in [(2, 1, 8, 8, 16), (2, 3, 4, 4, 5), (1, 1, 7, 8, 3), (1, 1, 5, 16, 4), (2, 1, 3, 4, 2)]:
    conv = nn.Conv2d(c, oc, 3, padding=1).to(q)  # wgrad_narrow_cpu on minimal planes: rows end at row ends
    xp = rng.standard_normal((n, c, oh + 2, ow + 2)).astype(np.float32)
    dy = rng.standard_normal((n, oc, oh, ow)).astype(np.float32)
    conv._wgrad_narrow(q, guarded(q, xp), guarded(q, dy))
    cols = np.lib.stride_tricks.sliding_window_view(xp.astype(np.float64), (3, 3), axis=(2, 3))
    ref = np.einsum("noyx,ncyxjl->ocjl", dy, cols).reshape(oc, -1)
    assert np.allclose(conv.weight.grad.to_host().reshape(oc, -1), ref, rtol=1e-4, atol=1e-4), (n, c, oh, ow)
if ops.config_class(q) == "cpu16":  # wgrad_oc16_cpu: blocks of output channels and taps past both ends
    for n, c, oh, ow, oc in [(2, 5, 4, 8, 28), (1, 16, 4, 4, 32), (1, 3, 4, 4, 20)]:
        conv = nn.Conv2d(c, oc, 3, padding=1).to(q)
        xp = rng.standard_normal((n, c, oh + 2, ow + 2)).astype(np.float32)
        dy = rng.standard_normal((n, oc, oh, ow)).astype(np.float32)
        conv.weight.grad = guarded(q, np.zeros(conv.weight.shape, np.float32))  # added to: read and written
        conv.bias.grad = guarded(q, np.zeros(oc, np.float32))
        conv._wgrad_oc16(q, guarded(q, xp), guarded(q, dy))
        cols = np.lib.stride_tricks.sliding_window_view(xp.astype(np.float64), (3, 3), axis=(2, 3))
        ref = np.einsum("noyx,ncyxjl->ocjl", dy, cols).reshape(oc, -1)
        assert np.allclose(conv.weight.grad.to_host().reshape(oc, -1), ref, rtol=1e-4, atol=1e-4), (n, c, oh, ow)
        assert np.allclose(conv.bias.grad.to_host(), dy.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-4)
q.finish()
print("ok")
'''


def test_vector_loads_stay_inside_their_operands(queue):
    if not ops.is_cpu(queue) or "Portable Computing Language" not in queue.device.platform.name:
        pytest.skip("PoCL's CPU device: its host-pointer buffers are the guarded host memory")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (
        f"exit {r.returncode} (-11: a read past an operand's end)\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
