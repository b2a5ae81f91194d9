"""ops.gemm against numpy on every kernel path: for GPUs gemm_tile in every operand layout, with
and without split-K; for CPUs gemm_cpu (packed B panels, K blocks, split-K), gemm_cpu_dot and gemm_cpu_thin;
transposes, sizes that are not multiples of any block, tails, batches with offsets, both bias
modes, beta, alpha."""
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_close

from netcl import Tensor, ops, tuning


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


def _check_gemm(queue, rng, batch, M, N, K, a_kmajor, b_layout, bias_mode, beta, what, alpha=0.75):
    """ops.gemm batched, with offsets into every buffer, a C whose rows and batch entries (two rows
    after each) are padded and alpha (by default != 1), against float64 numpy. a_kmajor: A stored
    (M, K) (contiguous along k), else (K, M). b_layout: "kn" stored (K, N), "nk" stored (N, K),
    "strided" n-stride 2 over a (K, 2N) buffer."""
    offa, offb, offc, ldc = 5, 7, 3, N + 4
    a = rng.standard_normal((batch, M, K)).astype(np.float32)
    b = rng.standard_normal((batch, K, N)).astype(np.float32)
    c0 = rng.standard_normal((batch, M + 2, ldc)).astype(np.float32)
    bias = rng.standard_normal(N if bias_mode == 1 else M).astype(np.float32)
    if a_kmajor:
        abuf, sa = a, (K, 1, M * K)
    else:
        abuf, sa = a.transpose(0, 2, 1).copy(), (1, M, M * K)
    if b_layout == "kn":
        bbuf, sb = b, (N, 1, K * N)
    elif b_layout == "strided":  # no fast path applies
        bbuf = np.zeros((batch, K, 2 * N), np.float32)
        bbuf[:, :, ::2] = b
        sb = (2 * N, 2, 2 * K * N)
    else:
        bbuf, sb = b.transpose(0, 2, 1).copy(), (1, K, N * K)
    A = Tensor.from_host(queue, np.concatenate([np.zeros(offa, np.float32), abuf.ravel()]))
    B = Tensor.from_host(queue, np.concatenate([np.zeros(offb, np.float32), bbuf.ravel()]))
    C = Tensor.from_host(queue, np.concatenate([np.zeros(offc, np.float32), c0.ravel()]))
    ops.gemm(M, N, K, A, sa, B, sb, C, (ldc, 1, (M + 2) * ldc), alpha=alpha, beta=beta,
             bias=Tensor.from_host(queue, bias) if bias_mode else None, bias_mode=bias_mode, batch=batch,
             offsets=(offa, offb, offc))
    ref = c0.astype(np.float64).copy()
    full = alpha * np.einsum("bmk,bkn->bmn", a.astype(np.float64), b)
    if bias_mode == 1:
        full += bias[None, None, :]
    elif bias_mode == 2:
        full += bias[None, :, None]
    ref[:, :M, :N] = full + beta * ref[:, :M, :N]
    got = C.to_host()[offc:].reshape(batch, M + 2, ldc)
    assert_close(got, ref, what=f"{what} bias_mode={bias_mode} beta={beta}")
    assert np.array_equal(got[:, :, N:], c0[:, :, N:]), "wrote past the n tail into C's row padding"
    assert np.array_equal(got[:, M:], c0[:, M:]), "wrote past the m tail into the rows after a batch entry"


# (case, batch, M, N, K, A contiguous along k, B layout) for the "gpu" class's gemm_tile (gemm.cl):
# each operand layout it loads (A m- or k-major, B n- or k-major, B strided), split-K, a taller M
_GEMM_PATHS = {
    "a_m_b_n": (3, 13, 21, 11, False, "kn"),
    "a_k_b_k": (3, 13, 21, 11, True, "nk"),
    "a_k_b_k_splitk": (3, 13, 21, 2200, True, "nk"),
    "tall_a_k_b_k": (3, 70, 21, 11, True, "nk"),
    "b_strided": (3, 13, 21, 11, False, "strided"),
}


@pytest.mark.parametrize("path", list(_GEMM_PATHS))
@pytest.mark.parametrize("bias_mode", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
def test_gemm_batched_bias_beta(queue, rng, monkeypatch, path, bias_mode, beta):
    monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})  # these kernels on any device
    _check_gemm(queue, rng, *_GEMM_PATHS[path], bias_mode, beta, path)


# gemm_cpu.cl's paths (the "cpu" and "cpu16" classes), with the kernel each case must reach:
# tails of every block (MR, NR, KC, the dot block, vector k), several K blocks (the first one
# writes the epilogue, later ones add), rows split over work-items, split-K for parallelism and
# for a long K, B packed from contiguous rows, from k-contiguous columns and from a stride, and
# K == 0 (C = beta * C + bias); "dot_n9" runs cpu16's dot blocks of 3 columns (ops._dot_blocks).
# "narrow" panels (N = 10, a classifier's; 3) load rows of B as whole vectors past their columns,
# but for the last rows (ops: k_wide), over batches with offsets, one vector of columns on cpu16;
# "small_k": both operands contiguous along k but K under dot_kmin (a Linear's input gradient);
# "dot_grouped": a short K, so a work-item takes several blocks along n (the last group fewer).
# gemm_cpu_nt (blocks of 16 x 16 on cpu16, 16 x 5 on cpu): whole blocks (stored as rows where the
# product is plain), tails of rows, columns and k (45 x 28 x 203: last blocks of 13 rows and 12
# columns on cpu16, 13 and 3 on cpu, and 25 chunks of 8 k, 3 left), one block (four on cpu, the
# last of one column); on cpu 32 x 144 x 128 takes 12 blocks a work-item, the last work-item 5.
_CPU_PATHS = {
    "narrow": (2, 19, 10, 300, False, "kn", "gemm_cpu", 1),
    "narrow_3": (2, 7, 3, 40, True, "kn", "gemm_cpu", 1),
    "narrow_k1": (2, 9, 10, 1, False, "kn", "gemm_cpu", 1),
    "small_k_tiles": (2, 37, 70, 5, False, "kn", "gemm_cpu", 1),
    "small_k": (3, 13, 21, 11, True, "nk", "gemm_cpu", 1),
    "outer": (3, 13, 45, 11, False, "kn", "gemm_cpu", 1),
    "outer_kblocks": (2, 19, 37, 600, False, "kn", "gemm_cpu", 1),
    "outer_row_groups": (1, 300, 40, 70, True, "kn", "gemm_cpu", 1),
    "outer_b_transposed": (2, 130, 35, 300, True, "nk", "gemm_cpu", 1),
    "outer_strided": (3, 13, 21, 11, False, "strided", "gemm_cpu", 1),
    "outer_splitk": (2, 13, 21, 33000, False, "kn", "gemm_cpu", 2),
    "dot": (3, 13, 21, 71, True, "nk", "gemm_cpu_dot", 1),
    "dot_vectors": (2, 7, 10, 211, True, "nk", "gemm_cpu_dot", 1),
    "dot_long_k": (2, 5, 6, 9000, True, "nk", "gemm_cpu_dot", 3),
    "dot_n9": (2, 6, 9, 300, True, "nk", "gemm_cpu_dot", 1),
    "dot_grouped": (2, 10, 150, 128, True, "nk", "gemm_cpu_dot", 1),
    "nt": (2, 32, 144, 128, True, "nk", "gemm_cpu_nt", 1),
    "nt_tails": (3, 45, 28, 203, True, "nk", "gemm_cpu_nt", 1),
    "nt_one_block": (1, 16, 16, 64, True, "nk", "gemm_cpu_nt", 1),
    "outer_k0": (2, 5, 7, 0, False, "kn", "gemm_cpu", 1),
    "k0_b_transposed": (2, 5, 7, 0, True, "nk", "gemm_cpu", 1),
}


@pytest.mark.parametrize("config", ["cpu", "cpu16"])
@pytest.mark.parametrize("path", list(_CPU_PATHS))
def test_cpu_gemm_paths(queue, rng, monkeypatch, config, path):
    monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: config})
    monkeypatch.setattr(ops, "compute_units", lambda q: 2)  # the work-item counts of this machine's 2 cores
    monkeypatch.setattr(ops, "_cpu_plans", {})
    batch, M, N, K, a_kmajor, b_layout, kernel, chunks = _CPU_PATHS[path]
    for bias_mode in (0, 1, 2):
        for beta in (0.0, 1.0, 0.5):
            _check_gemm(queue, rng, batch, M, N, K, a_kmajor, b_layout, bias_mode, beta, f"{config} {path}")
        # alpha 1, no beta: gemm_cpu's plain epilogue (whole tiles stored without tests)
        _check_gemm(queue, rng, batch, M, N, K, a_kmajor, b_layout, bias_mode, 0.0, f"{config} {path} alpha 1", 1.0)
    dot = {"gemm_cpu_dot": "dot", "gemm_cpu_nt": "nt"}.get(kernel)
    plan = ops._cpu_plans[(queue.context, config, M, N, K, batch, dot, tuning.version())]
    assert (plan[0].function_name, plan[3] > 1) == (kernel, chunks > 1), f"{path} took {plan[0].function_name}"
    if path == "dot_grouped":
        mblocks, nblocks, nper = plan[1][:3]
        assert 1 < nper < nblocks and nblocks % nper, "blocks along n in groups, the last one short"
    if path == "nt" and config == "cpu":
        assert plan[1][:3] == (2, 29, 12), "16 x 5 blocks, 12 to a work-item"


def test_nt_rows_of_a_fit_its_private_memory():
    """The 8-wide gemm_cpu_nt holds A's rows over its whole K chunk in a private array of NT_KMAX k."""
    source = (Path(ops.__file__).parent / "kernels" / "gemm_cpu.cl").read_text()
    assert f"#define NT_KMAX {tuning.values('gemm_cpu_cutoffs', 'cpu16')['nt_max_k']}\n" in source


# gemm_cpu_thin (K <= the tuning table's thin_k, rows of C of a few vectors, B and C contiguous along n, C = A
# B): (batch, M, N, K, A contiguous along k, blocks of rows). A detection head's data gradient
# (512 x 16 x 5 over 8 images), tails of a vector of columns (N = 3, 21, 30), one image's rows over
# both cores, a work-item an image for little work, K = 1 and 8.
_THIN_CASES = [(8, 512, 16, 5, False, 2), (3, 70, 21, 1, True, 1), (1, 300, 30, 8, False, 2),
               (2, 130, 3, 3, True, 1), (1, 5, 32, 7, False, 1)]


@pytest.mark.parametrize("config", ["cpu", "cpu16"])
@pytest.mark.parametrize("case", _THIN_CASES)
def test_cpu_gemm_thin(queue, rng, monkeypatch, config, case):
    monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: config})
    monkeypatch.setattr(ops, "compute_units", lambda q: 2)
    monkeypatch.setattr(ops, "_cpu_plans", {})
    batch, M, N, K, a_kmajor, mblocks = case
    _check_gemm(queue, rng, batch, M, N, K, a_kmajor, "kn", 0, 0.0, f"{config} thin", 1.0)
    kernel, (mgroups, mstep), items = ops._cpu_plans[(queue.context, config, "thin", M, N, K, batch, tuning.version())]
    assert kernel.function_name == "gemm_cpu_thin" and (mgroups - 1) * mstep < M <= mgroups * mstep
    assert (mgroups, items) == (mblocks, batch * mblocks)
    # alpha, beta, a bias or a B strided along n: gemm_cpu's epilogue and panels
    for b_layout, bias_mode, beta, alpha in [("kn", 1, 0.0, 1.0), ("kn", 2, 0.0, 1.0), ("kn", 0, 0.5, 1.0),
                                             ("kn", 0, 0.0, 0.75), ("strided", 0, 0.0, 1.0)]:
        ops._cpu_plans.clear()
        _check_gemm(queue, rng, batch, M, N, K, a_kmajor, b_layout, bias_mode, beta, f"{config} not thin", alpha)
        assert [key[2] for key in ops._cpu_plans] == [M], f"{b_layout} {bias_mode} {beta} {alpha}: not gemm_cpu"


def test_dot_block_width():
    """gemm_cpu_dot's blocks of 3 columns only where 4-wide ones would repeat a fifth or more."""
    cfg = tuning.values("gemm_cpu", "cpu16")
    assert [ops._dot_blocks(cfg, n)["DN"] for n in (3, 9, 10, 16, 21, 27, 45, 288)] == [3, 3, 4, 4, 4, 4, 4, 4]


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


def _check_sum_axis(queue, rng, I, J, rows, accumulate, off):
    """sum_axis over x (J rows of I, or I rows of J) after `off` floats, into out (accumulating or
    not): against float64 numpy, and the same bits on a second run."""
    x = rng.standard_normal((J, I) if rows else (I, J)).astype(np.float32)
    si, sj = (1, I) if rows else (J, 1)
    X = Tensor.from_host(queue, np.concatenate([np.zeros(off, np.float32), x.ravel()]))
    out0 = rng.standard_normal(J).astype(np.float32)
    ref = x.astype(np.float64).sum(axis=1 if rows else 0) + (out0 if accumulate else 0.0)
    results = [ops.sum_axis(X, I, J, si, sj, Tensor.from_host(queue, out0), accumulate=accumulate, off=off).to_host()
               for _ in range(2)]
    assert_close(results[0], ref, what=f"sum_axis I={I} J={J}")
    assert np.array_equal(results[0], results[1]), "sum_axis result changed between runs"


@pytest.mark.parametrize("I,J,rows", [(16384, 3, True), (21011, 2, True), (20003, 5, False), (16383, 2, True)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_sum_axis_two_stages(queue, rng, gpu_config, I, J, rows, accumulate):
    """sum_axis on the GPU class: two stages from _SUM_SPLIT summands on (whole chunks, a tail
    chunk; each output's summands contiguous as conv's bias gradients or strided as Linear's),
    one stage below; after an offset, accumulating or not; the same bits on every run."""
    assert ops._SUM_SPLIT == 16384 and ops._SUM_CHUNK == 4096
    _check_sum_axis(queue, rng, I, J, rows, accumulate, off=7)


@pytest.mark.parametrize("I,J,rows", [(20003, 5, True), (64, 96, False), (1, 3, False), (37, 1, True)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_sum_axis_cpu(queue, rng, I, J, rows, accumulate):
    """sum_axis on the CPU classes (norm_cpu.cl's sum_axis_cpu, a work-item per output): contiguous
    and strided summands after an offset, accumulating or not, the same bits on every run."""
    if not ops.is_cpu(queue):
        pytest.skip("the CPU classes' kernel")
    _check_sum_axis(queue, rng, I, J, rows, accumulate, off=5)


def test_whole_tiles_store_what_the_general_epilogue_stores(queue):
    """gemm_cpu stores whole tiles of a plain product without the epilogue's tests: rows in whole
    tiles (0-7) and in the partial one (8) hold the same bits, down to a sum of -0.0."""
    if not ops.is_cpu(queue):
        pytest.skip("gemm_cpu is the CPU classes' kernel")
    a, b = np.full((9, 1), -1e-30, np.float32), np.full((1, 32), 1e-30, np.float32)
    for bias in (None, Tensor.from_host(queue, np.full(32, -0.0, np.float32))):
        c = ops.matmul(Tensor.from_host(queue, a), Tensor.from_host(queue, b), bias=bias,
                       bias_mode=0 if bias is None else 1).to_host()
        assert np.all(np.signbit(c)) and np.array_equal(c[0], c[8])
