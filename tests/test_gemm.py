"""ops.gemm against numpy on every kernel path: gemm_vn (B and C contiguous along n), gemm_dot
with and without split-K (A and B contiguous along k), B^T copied then gemm_vn, the strided fallback; transposes, sizes
that are not multiples of any block, tails, batches with offsets, both bias modes, beta."""
import numpy as np
import pytest
from conftest import assert_close

from netcl import Tensor, ops


def _strides(layout_t, rows, cols):
    """(row, col) element strides of a (rows, cols) operand stored plain or transposed."""
    return (1, rows) if layout_t else (cols, 1)


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (5, 7, 3), (17, 33, 19), (64, 16, 144), (3, 100, 2500),
                                   (16, 9, 4096), (40, 130, 70)])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_layouts(queue, rng, M, N, K, ta, tb):
    a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
    ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b)
    got = ops.matmul(Tensor.from_host(queue, a), Tensor.from_host(queue, b), trans_a=ta, trans_b=tb).to_host()
    assert_close(got, ref, what=f"matmul {M}x{N}x{K} ta={ta} tb={tb}")


@pytest.mark.parametrize("path", ["vn", "dot", "dot_splitk", "nt_transposed", "strided"])
@pytest.mark.parametrize("bias_mode", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
def test_gemm_batched_bias_beta(queue, rng, path, bias_mode, beta):
    """Batched, with offsets into every buffer and a C whose rows are padded, alpha != 1."""
    batch, M, N = 3, 70 if path == "nt_transposed" else 13, 21  # M >= 64: B^T copied, then gemm_vn
    K = 2200 if path == "dot_splitk" else 11
    alpha = 0.75
    a_t = path in ("dot", "dot_splitk", "nt_transposed")  # A (M, K) row-major for dot, else stored (K, M) for vn/strided
    b_kn = path == "vn"  # B stored (K, N) for vn, (N, K) for dot, and a strided view for the fallback
    offa, offb, offc, ldc = 5, 7, 3, N + 4
    a = rng.standard_normal((batch, M, K)).astype(np.float32)
    b = rng.standard_normal((batch, K, N)).astype(np.float32)
    c0 = rng.standard_normal((batch, M, ldc)).astype(np.float32)
    bias = rng.standard_normal(N if bias_mode == 1 else M).astype(np.float32)
    if a_t:
        abuf, sa = a, (K, 1, M * K)
    else:
        abuf, sa = a.transpose(0, 2, 1).copy(), (1, M, M * K)
    if b_kn:
        bbuf, sb = b, (N, 1, K * N)
    elif path == "strided":  # n-stride 2 over a (K, 2N) buffer: no fast path applies
        bbuf = np.zeros((batch, K, 2 * N), np.float32)
        bbuf[:, :, ::2] = b
        sb = (2 * N, 2, 2 * K * N)
    else:
        bbuf, sb = b.transpose(0, 2, 1).copy(), (1, K, N * K)
    A = Tensor.from_host(queue, np.concatenate([np.zeros(offa, np.float32), abuf.ravel()]))
    B = Tensor.from_host(queue, np.concatenate([np.zeros(offb, np.float32), bbuf.ravel()]))
    C = Tensor.from_host(queue, np.concatenate([np.zeros(offc, np.float32), c0.ravel()]))
    ops.gemm(M, N, K, A, sa, B, sb, C, (ldc, 1, M * ldc), alpha=alpha, beta=beta,
             bias=Tensor.from_host(queue, bias) if bias_mode else None, bias_mode=bias_mode, batch=batch,
             offsets=(offa, offb, offc))
    ref = c0.astype(np.float64).copy()
    full = alpha * np.einsum("bmk,bkn->bmn", a.astype(np.float64), b)
    if bias_mode == 1:
        full += bias[None, None, :]
    elif bias_mode == 2:
        full += bias[None, :, None]
    ref[:, :, :N] = full + beta * ref[:, :, :N]
    got = C.to_host()[offc:].reshape(batch, M, ldc)
    assert_close(got, ref, what=f"{path} bias_mode={bias_mode} beta={beta}")
    assert np.array_equal(got[:, :, N:], c0[:, :, N:]), "wrote past the n tail into C's row padding"


@pytest.mark.parametrize("config", ["cpu", "cpu16", "gpu"])
def test_every_device_config(queue, rng, monkeypatch, config):
    """The block sizes of every device class compile and agree with numpy on this device."""
    monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: config})
    for M, N, K, ta, tb in [(37, 45, 29, True, False), (70, 33, 21, False, True), (9, 6, 3000, False, True),
                            (5, 3, 7, False, False)]:
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b)
        got = ops.matmul(Tensor.from_host(queue, a), Tensor.from_host(queue, b), trans_a=ta, trans_b=tb).to_host()
        assert_close(got, ref, what=f"{config} {M}x{N}x{K} ta={ta} tb={tb}")


@pytest.fixture
def gpu_config(queue, monkeypatch):
    """ops.gemm takes its GPU path (gemm_tile) on this device; 8 compute units, so that
    split-K starts below 32 tiles whatever this machine has."""
    monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    monkeypatch.setattr(ops, "_compute_units", {queue.device.int_ptr: 8})


def _operand(rng, batch, rows, cols, contiguous_cols, offset):
    """A (batch, rows, cols) operand stored with cols or rows contiguous, after `offset` zeros:
    (values, buffer, (row, col, batch) strides)."""
    v = rng.standard_normal((batch, rows, cols)).astype(np.float32)
    stored = v if contiguous_cols else v.transpose(0, 2, 1).copy()
    strides = (cols, 1, rows * cols) if contiguous_cols else (1, rows, rows * cols)
    return v, np.concatenate([np.zeros(offset, np.float32), stored.ravel()]), strides


@pytest.mark.parametrize("a_kmajor,b_kmajor", [(True, False), (False, False), (True, True), (False, True)])
@pytest.mark.parametrize("K", [11, 2200])  # under one BK step; split-K with a k tail
@pytest.mark.parametrize("bias_mode,beta", [(0, 0.0), (1, 1.0), (2, 0.5)])
def test_gpu_tile_layouts(queue, rng, gpu_config, a_kmajor, b_kmajor, K, bias_mode, beta):
    """gemm_tile in every operand layout: tails in m and n (37 x 45 on 64 x 64 tiles), batched,
    offsets into every buffer, C rows padded, alpha, beta, both bias modes."""
    batch, M, N, alpha, offs, ldc = 3, 37, 45, 0.75, (5, 7, 3), 45 + 4
    a, abuf, sa = _operand(rng, batch, M, K, a_kmajor, offs[0])
    b, bbuf, sb = _operand(rng, batch, K, N, not b_kmajor, offs[1])
    c0 = rng.standard_normal((batch, M, ldc)).astype(np.float32)
    bias = rng.standard_normal(N if bias_mode == 1 else M).astype(np.float32)
    C = Tensor.from_host(queue, np.concatenate([np.zeros(offs[2], np.float32), c0.ravel()]))
    ops.gemm(M, N, K, Tensor.from_host(queue, abuf), sa, Tensor.from_host(queue, bbuf), sb, C, (ldc, 1, M * ldc),
             alpha=alpha, beta=beta, bias=Tensor.from_host(queue, bias) if bias_mode else None,
             bias_mode=bias_mode, batch=batch, offsets=offs)
    ref = c0.astype(np.float64)
    full = alpha * np.einsum("bmk,bkn->bmn", a.astype(np.float64), b) + beta * ref[:, :, :N]
    full += bias[None, None, :] if bias_mode == 1 else bias[None, :, None] if bias_mode == 2 else 0.0
    ref[:, :, :N] = full
    got = C.to_host()[offs[2]:].reshape(batch, M, ldc)
    assert_close(got, ref, what=f"gemm_tile a_kmajor={a_kmajor} b_kmajor={b_kmajor} K={K}")
    assert np.array_equal(got[:, :, N:], c0[:, :, N:]), "wrote past the n tail into C's row padding"


@pytest.mark.parametrize("M,N,K", [(64, 72, 4096), (16, 27, 20000), (72, 300, 64)])
def test_gpu_training_shapes(queue, rng, gpu_config, M, N, K):
    """The conv GEMMs of a training step, reduced: weight gradients dY @ cols^T (both operands
    contiguous along k, small C, long K: split-K; 16 x 27 on a shrunk 16 x 32 tile) and the
    data gradient W^T @ dY (A contiguous along m). Split-K sums in a fixed order: bitwise
    repeatable."""
    wgrad = K > N
    a = rng.standard_normal((K, M) if not wgrad else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if wgrad else (K, N)).astype(np.float32)
    A, B = Tensor.from_host(queue, a), Tensor.from_host(queue, b)
    first = ops.matmul(A, B, trans_a=not wgrad, trans_b=wgrad).to_host()
    ref = (a if wgrad else a.T).astype(np.float64) @ (b.T if wgrad else b)
    assert_close(first, ref, what=f"{M}x{N}x{K}")
    again = ops.matmul(A, B, trans_a=not wgrad, trans_b=wgrad).to_host()
    assert np.array_equal(first, again), "split-K result changed between runs"
