"""The fused inference path (netcl.jit): equal to the unfused layers, never stale, no rebuilds."""
import numpy as np
import pytest

import netcl
from netcl import Tensor, jit, models, nn, ops, optim, runtime
from conftest import randomize_batchnorm

pytest.importorskip("pyopencl")


def _unfused(model, q, x):
    plan, model._fused = model._fused, None
    try:
        return model(Tensor.from_host(q, x)).to_host()
    finally:
        model._fused = plan


def _fused(model, q, x):
    assert model._fused is not None
    return model(Tensor.from_host(q, x)).to_host()


def small_detector():
    """detector26's structure at a reduced size: Conv-BN-LeakyReLU-MaxPool blocks, then a 1x1 conv + Sigmoid."""
    layers, chans = [], [3, 8, 16, 24]
    for a, b in zip(chans, chans[1:]):
        layers += [nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.LeakyReLU(0.1), nn.MaxPool2d(2)]
    return nn.Sequential(*layers, nn.Conv2d(24, 5, 1), nn.Sigmoid())


CASES = [("mlp", models.mlp, (64,)), ("cnn", models.cnn, (3, 32, 32)), ("small_detector", small_detector, (3, 32, 32))]


@pytest.mark.parametrize("name,build,shape", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("batch", [1, 3])
def test_fused_equals_unfused(q, name, build, shape, batch):
    rng = np.random.default_rng(batch)
    netcl.manual_seed(1)
    model = randomize_batchnorm(build(), rng).eval()
    x = rng.normal(size=(batch,) + shape).astype(np.float32)
    ref = _unfused(model, q, x)
    y = _fused(model, q, x)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(model._fused.infer(x, q), y)


@pytest.mark.slow  # PoCL compiles the GPU family's local-memory kernels slowly (about 45 s a program)
def test_gpu_kernels_on_this_device(q, monkeypatch):
    """The GPU family (local-memory tiles, split-K) computes the same function on any device."""
    monkeypatch.setenv("NETCL_JIT_CLASS", "gpu")
    rng = np.random.default_rng(5)
    netcl.manual_seed(2)
    model = randomize_batchnorm(models.cnn(), rng).eval()
    x = rng.normal(size=(2, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(_fused(model, q, x), _unfused(model, q, x), atol=1e-5, rtol=1e-5)


def _conv_ref(x, w, b, pad):
    """float64 conv2d, stride 1: x (N, C, H, W), w (K, C, k, k)."""
    k = w.shape[-1]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = xp.shape[2] - k + 1, xp.shape[3] - k + 1
    cols = np.stack([xp[:, :, i:i + oh, j:j + ow] for i in range(k) for j in range(k)], 2)  # N, C, k*k, OH, OW
    return np.einsum("nckhw,ock->nohw", cols, w.reshape(w.shape[0], w.shape[1], k * k)) + b[None, :, None, None]


@pytest.mark.slow  # PoCL compiles the GPU family's local-memory kernels slowly (about 45 s a program)
@pytest.mark.parametrize("atomic", ["1", "0"])
def test_gpu_split_k_is_deterministic_and_equals_the_unsplit_conv(q, monkeypatch, atomic):
    """The GPU family's split-K (few output tiles, a long reduction: the parts, then their sum in a
    fixed order, by the last work-group of a tile where the device has OpenCL 2's acquire-release
    atomics, else by conv_gpu_reduce) against float64 numpy, against NETCL_GPU_SPLIT=0, and equal to
    itself bit for bit, with the 2x2 pool and without."""
    from netcl.jit.executable import _Bound

    monkeypatch.setenv("NETCL_JIT_CLASS", "gpu")  # two tiles a conv here: split in 2 on a 2-core CPU
    monkeypatch.setenv("NETCL_GPU_SPLIT_ATOMIC", atomic)
    one_launch = atomic == "1" and runtime.acq_rel_atomics(q.device) is not None
    netcl.manual_seed(8)
    model = nn.Sequential(nn.Conv2d(48, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                          nn.MaxPool2d(2)).eval()
    x = np.random.default_rng(8).normal(size=(2, 48, 6, 6)).astype(np.float32)
    sd = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    h = np.maximum(_conv_ref(x.astype(np.float64), sd["0.weight"], sd["0.bias"], 1), 0)
    h = np.maximum(_conv_ref(h, sd["2.weight"], sd["2.bias"], 1), 0)
    ref = h.reshape(2, 32, 3, 2, 3, 2).max((3, 5))
    runs = {}
    for split in ("1", "0"):
        monkeypatch.setenv("NETCL_GPU_SPLIT", split)
        model.train().eval()  # a new plan, built under this environment
        runs[split] = [_fused(model, q, x) for _ in range(3)]
        names = [s.name for s in next(iter(model._fused._exe.values())).steps if isinstance(s, _Bound)]
        assert names.count("conv_gpu_reduce") == (2 if split == "1" and not one_launch else 0), names
        assert names.count("conv_gpu") == 2, names
    split, whole = runs["1"], runs["0"]
    for y in split + whole:
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    for y in split[1:]:
        np.testing.assert_array_equal(y, split[0])
    np.testing.assert_allclose(split[0], whole[0], rtol=1e-5, atol=1e-5)


def test_plan_structure_and_launches(q):
    model = models.detector26().eval()
    plan = model._fused
    assert plan is not None and plan.launches((1, 3, 256, 256)) == 7  # one kernel per conv block
    model.train()
    assert model._fused is None  # train() drops the plan
    model.eval()
    assert model._fused is not None


def test_train_mode_runs_unfused(q):
    rng = np.random.default_rng(0)
    model = models.cnn().eval()
    model.train()
    x = rng.normal(size=(2, 3, 32, 32)).astype(np.float32)
    before = jit.STATS["launches"]
    model(Tensor.from_host(q, x))
    assert jit.STATS["launches"] == before


def test_load_state_dict_after_eval_is_not_stale(q):
    rng = np.random.default_rng(3)
    netcl.manual_seed(3)
    model = randomize_batchnorm(models.cnn(), rng).eval()
    x = rng.normal(size=(2, 3, 32, 32)).astype(np.float32)
    y0 = _fused(model, q, x)
    netcl.manual_seed(4)
    other = randomize_batchnorm(models.cnn(), np.random.default_rng(9))
    model.load_state_dict(other.state_dict())
    y1 = _fused(model, q, x)
    assert np.abs(y1 - y0).max() > 1e-3
    np.testing.assert_allclose(y1, _unfused(model, q, x), atol=1e-5, rtol=1e-5)


def test_optimizer_step_after_eval_is_not_stale(q):
    rng = np.random.default_rng(4)
    netcl.manual_seed(5)
    model = randomize_batchnorm(models.mlp(), rng)
    x = rng.normal(size=(4, 64)).astype(np.float32)
    opt = optim.SGD(model.parameters(), lr=0.5)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    loss_fn(model(Tensor.from_host(q, x)), np.array([0, 1, 2, 3]))
    model.backward(loss_fn.backward())
    model.eval()
    y0 = _fused(model, q, x)
    opt.step()  # weights change while the plan exists
    y1 = _fused(model, q, x)
    assert np.abs(y1 - y0).max() > 1e-4
    np.testing.assert_allclose(y1, _unfused(model, q, x), atol=1e-5, rtol=1e-5)


def test_no_builds_or_allocations_after_first_call(q, monkeypatch):
    import pyopencl as cl

    from netcl.runtime import program

    rng = np.random.default_rng(6)
    model = randomize_batchnorm(small_detector(), rng).eval()
    x = rng.normal(size=(2, 3, 32, 32)).astype(np.float32)
    _fused(model, q, x)
    model._fused.infer(x, q)

    builds, buffers = [0], [0]
    real_build, real_buffer = program.build, cl.Buffer

    def counting_build(*a, **k):
        builds[0] += 1
        return real_build(*a, **k)

    class CountingBuffer(real_buffer):
        def __init__(self, *a, **k):
            buffers[0] += 1
            super().__init__(*a, **k)

    monkeypatch.setattr(program, "build", counting_build)
    monkeypatch.setattr("netcl.runtime.build", counting_build)
    monkeypatch.setattr(cl, "Buffer", CountingBuffer)
    stats = dict(jit.STATS)
    from netcl.runtime import _pools

    pool = _pools[q.context]
    held = pool.held_blocks + pool.active_blocks
    for _ in range(3):
        xt = Tensor.from_host(q, x)
        y = model(xt).to_host()
        del xt
        model._fused.infer(x, q)
    assert builds[0] == 0 and buffers[0] == 0
    assert jit.STATS["builds"] == stats["builds"] and jit.STATS["buffers"] == stats["buffers"]
    assert pool.held_blocks + pool.active_blocks <= held + 2  # the output (and input) reuse pooled blocks
    assert y.shape == (2, 5, 4, 4)


def test_unfusable_layers_fall_back(q):
    rng = np.random.default_rng(7)
    model = nn.Sequential(nn.Linear(8, 16), nn.Softmax(dim=1), nn.Identity(), nn.Linear(16, 4), nn.Dropout(0.5),
                          nn.Tanh()).eval()
    x = rng.normal(size=(3, 8)).astype(np.float32)
    np.testing.assert_allclose(_fused(model, q, x), _unfused(model, q, x), atol=1e-5, rtol=1e-5)


def winograd_net():
    """3x3 stride-1 convolutions at odd sizes and channel counts: pooled and not, padded and not,
    the first one fed by an unfused layer (no stored border, so its loads are bounds-checked)."""
    return nn.Sequential(
        nn.Sigmoid(),
        nn.Conv2d(5, 13, 3, padding=1), nn.BatchNorm2d(13), nn.LeakyReLU(0.1), nn.MaxPool2d(2),
        nn.Conv2d(13, 40, 3, padding=1), nn.BatchNorm2d(40), nn.ReLU(),
        nn.Conv2d(40, 9, 3, padding=1), nn.Tanh(),
        nn.Conv2d(9, 8, 3), nn.BatchNorm2d(8), nn.MaxPool2d(2))


@pytest.mark.parametrize("tile", [pytest.param("0", marks=pytest.mark.slow), "2", "4"])
@pytest.mark.parametrize("batch", [1, 3])
def test_winograd_equals_unfused(q, monkeypatch, tile, batch):
    """The CPU Winograd kernels (output tiles 2 and 4; 0 = direct) against the unfused layers."""
    monkeypatch.setenv("NETCL_CPU_WINO", tile)
    rng = np.random.default_rng(10 + batch)
    netcl.manual_seed(7)
    model = randomize_batchnorm(winograd_net(), rng).eval()
    x = rng.normal(size=(batch, 5, 15, 13)).astype(np.float32)
    ref = _unfused(model, q, x)
    y = _fused(model, q, x)
    assert y.shape == ref.shape == (batch, 8, 2, 2)
    np.testing.assert_allclose(y, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("width", [8, 16, 32, 64])
def test_tile_lane_winograd_equals_unfused(q, monkeypatch, width):
    """conv_winot.cl (16 output tiles of 2x2 in a float16: 4 tile rows of an 8-wide output, 2 of a
    16-wide one, one of 32, two vectors of 64) with 20 and 8 output channels (blocks of 16 and 8,
    zero-padded), a residual add and the activation after it, a Concat slice and stored borders;
    equal to the unfused layers at batch 1 and 3. NETCL_CPU_WINOT=0 turns the family off."""
    from netcl.jit.executable import _Bound

    monkeypatch.setenv("NETCL_CPU_WINOT", "1")
    rng = np.random.default_rng(width)
    netcl.manual_seed(width)
    model = randomize_batchnorm(nn.Sequential(
        nn.Sigmoid(), nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 20, 3, padding=1), nn.BatchNorm2d(20), nn.LeakyReLU(0.1),
        nn.Residual(nn.Conv2d(20, 20, 3, padding=1), nn.BatchNorm2d(20)), nn.ReLU(),
        nn.Concat(nn.Conv2d(20, 9, 3, padding=1), nn.Conv2d(20, 5, 1)),
        nn.Conv2d(14, 8, 3, padding=1)), rng).eval()
    for n in (1, 3):
        x = rng.normal(size=(n, 3, 8, width)).astype(np.float32)
        np.testing.assert_allclose(_fused(model, q, x), _unfused(model, q, x), atol=1e-5, rtol=1e-5)
    names = [s.launch.name for s in next(iter(model._fused._exe.values())).steps if isinstance(s, _Bound)]
    if ops.is_cpu(q):
        assert names.count("conv_winot") == 4, names
        from netcl.convspec import WINOT_MAX_C, ConvSpec, winot_layout
        wide = [ConvSpec(c, 8, width, 8, 3, 1, 1, 8, width, False, 1, 0, None, 0.0) for c in (WINOT_MAX_C, WINOT_MAX_C + 1)]
        assert winot_layout(wide[0]) is not None and winot_layout(wide[1]) is None  # private inputs bounded
        monkeypatch.setenv("NETCL_CPU_WINOT", "0")
        model.eval()  # a new plan, built under the new setting
        model.predict(x, q)
        names = [s.launch.name for s in next(iter(model._fused._exe.values())).steps if isinstance(s, _Bound)]
        assert "conv_winot" not in names, names


@pytest.mark.parametrize("ow", [2, 4, 8, 16])
@pytest.mark.parametrize("padding", [0, 1])
def test_stride2_direct_conv_at_every_vector_width(q, ow, padding):
    """The CPU direct kernel at stride 2 (its even-element loads) for rows of 2, 4, 8 and 16
    outputs, the input as wide as the outputs need and no wider (odd), stored with and without a
    border, batch 1 and 3."""
    rng = np.random.default_rng(ow + padding)
    netcl.manual_seed(ow)
    w = 2 * ow + 1 - 2 * padding
    model = randomize_batchnorm(nn.Sequential(nn.Sigmoid(), nn.Conv2d(3, 9, 3, stride=2, padding=padding),
                                              nn.BatchNorm2d(9), nn.ReLU(),
                                              nn.Conv2d(9, 4, 3, stride=2, padding=1)), rng).eval()
    for n in (1, 3):
        x = rng.normal(size=(n, 3, 5, w)).astype(np.float32)
        y = _fused(model, q, x)
        assert y.shape[3] == -(-ow // 2)
        np.testing.assert_allclose(y, _unfused(model, q, x), atol=1e-5, rtol=1e-5)


def test_two_rows_per_vector_on_8x8_planes(q, monkeypatch):
    """Rows of half a float16 (8x8 planes) go two to a vector (PACK 2) where the input carries its
    border: 3x3 at stride 2 and 1, the 1x1 stride-2 shortcut reading inside a wider border, a
    residual add and the activation after it in the epilogue, 5x5; a pooled conv stays unpacked.
    Equal to the unfused layers at batch 1 and 3."""
    from netcl.jit.executable import _Bound

    monkeypatch.setenv("NETCL_CPU_WINO", "0")
    rng = np.random.default_rng(21)
    netcl.manual_seed(21)
    block = nn.Residual(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16),
                        shortcut=nn.Sequential(nn.Conv2d(8, 16, 1, stride=2), nn.BatchNorm2d(16)))
    model = randomize_batchnorm(nn.Sequential(
        nn.Sigmoid(), nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), block, nn.Hardswish(),
        nn.Conv2d(16, 8, 5, padding=2), nn.Tanh(), nn.Conv2d(8, 4, 3, padding=1), nn.MaxPool2d(2)), rng).eval()
    for n in (1, 3):
        x = rng.normal(size=(n, 3, 16, 16)).astype(np.float32)
        np.testing.assert_allclose(_fused(model, q, x), _unfused(model, q, x), atol=1e-5, rtol=1e-5)
    exe = next(iter(model._fused._exe.values()))
    packs = [getattr(s.launch, "rows_per_vector", None) for s in exe.steps if isinstance(s, _Bound)]
    if ops.is_cpu(q):
        assert packs == [1, 2, 2, 2, 2, 1], packs
        from netcl.jit.config import JitConfig
        from netcl.jit.conv_cpu import cpu_block
        spec = next(s.launch.spec for s in exe.steps if isinstance(s, _Bound) and s.launch.rows_per_vector == 2)
        assert cpu_block(spec, JitConfig(cpu_conv=(32, 8)))[::3] == (16, 2)  # a wider setting still packs float16


@pytest.mark.parametrize("w", [4, 8, 12, 16, 32, 6])
@pytest.mark.parametrize("ks", [3, 5])
def test_unpadded_input_edges_at_every_vector_width(q, monkeypatch, w, ks):
    """A model's first conv reads an input stored without a border: the direct CPU kernel builds the
    first and last vector of a row from one load and a shift in zeros (3x3 and 5x5, rows of 4 to 32
    columns: vectors of 4, 8 and 16; 6: vectors of 2, lane by lane), equal to the unfused layers."""
    monkeypatch.setenv("NETCL_CPU_WINO", "0")  # the direct kernel at every width
    rng = np.random.default_rng(w + ks)
    netcl.manual_seed(w)
    model = randomize_batchnorm(nn.Sequential(nn.Conv2d(3, 9, ks, padding=ks // 2), nn.BatchNorm2d(9), nn.ReLU(),
                                              nn.Conv2d(9, 4, 3, padding=1)), rng).eval()
    for n in (1, 2):
        x = rng.normal(size=(n, 3, 6, w)).astype(np.float32)
        np.testing.assert_allclose(_fused(model, q, x), _unfused(model, q, x), atol=1e-5, rtol=1e-5)


def test_winograd_choice_follows_the_vector_width():
    """Winograd's float8 blocks run at half width on AVX-512: there the direct kernel takes every
    3x3 conv whose rows fill a native vector; on 8-wide devices (AVX2) the choice is by shape."""
    from types import SimpleNamespace

    from netcl.jit.config import JitConfig
    from netcl.jit.conv_wino import wino_tile

    spec = SimpleNamespace(ks=3, stride=1, k=64, used=(16, 16))
    config = JitConfig()
    assert wino_tile(spec, config, 32, direct_vw=16, native_vw=16) == 0
    assert wino_tile(spec, config, 32, direct_vw=8, native_vw=16) == 4
    assert wino_tile(spec, config, 32, direct_vw=16, native_vw=8) == 4
    assert wino_tile(spec, config, 1, direct_vw=0, native_vw=16) == 2  # no direct kernel fits
    assert wino_tile(SimpleNamespace(ks=3, stride=2, k=64, used=(16, 16)), config, 32, 16, 8) == 0
    assert wino_tile(spec, JitConfig(cpu_wino=2), 32, direct_vw=16, native_vw=16) == 2  # forced


@pytest.mark.parametrize("tile", ["2", "4"])
def test_winograd_block_shapes(q, monkeypatch, tile):
    """Register blocks that leave tiles and channel blocks partly empty still agree."""
    monkeypatch.setenv("NETCL_CPU_WINO", tile)
    monkeypatch.setenv("NETCL_CPU_WINO_BLOCK", "2,1,3")
    rng = np.random.default_rng(12)
    netcl.manual_seed(8)
    model = randomize_batchnorm(winograd_net(), rng).eval()
    x = rng.normal(size=(2, 5, 15, 13)).astype(np.float32)
    np.testing.assert_allclose(_fused(model, q, x), _unfused(model, q, x), atol=1e-5, rtol=1e-5)


ACTIVATIONS = {"GELU": nn.GELU, "GELU-tanh": lambda: nn.GELU("tanh"), "SiLU": nn.SiLU, "ReLU6": nn.ReLU6,
               "Hardswish": nn.Hardswish, "Hardsigmoid": nn.Hardsigmoid}


@pytest.mark.parametrize("make_act", ACTIVATIONS.values(), ids=ACTIVATIONS.keys())
def test_new_activations_fuse(q, make_act):
    """Each activation rides in the convolution (Winograd and direct) and linear kernels' epilogues
    (act.h), and equals the layer-by-layer forward."""
    rng = np.random.default_rng(3)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), make_act(), nn.Conv2d(6, 5, 3, stride=2),
                          make_act(), nn.Flatten(), nn.Linear(5 * 4 * 4, 9), make_act())
    model = randomize_batchnorm(model, rng).eval()
    x = rng.normal(0, 2, size=(2, 3, 9, 9)).astype(np.float32)
    assert model._fused.launches(x.shape) == 3
    assert type(make_act()).__name__ not in repr(model._fused)  # no activation left as a layer of its own
    np.testing.assert_allclose(_fused(model, q, x), _unfused(model, q, x), atol=1e-5, rtol=1e-5)


def test_new_layers_run_inside_a_plan(q):
    """LayerNorm, Transpose, AdaptiveAvgPool and Flatten(start, end) between fused stages: a Linear
    on rank-3 and rank-4 input, LayerNorm + Linear, a Transpose and the mean over tokens are one
    fused kernel each; only AdaptiveAvgPool2d(3) (not global) runs its own forward."""
    rng = np.random.default_rng(4)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.SiLU(), nn.AdaptiveAvgPool2d(3), nn.Linear(3, 6),
                          nn.GELU(), nn.Flatten(2, 3), nn.Transpose(1, 2), nn.LayerNorm(8), nn.Linear(8, 4),
                          nn.Hardswish(), nn.Transpose(1, 2), nn.AdaptiveAvgPool1d(1), nn.Flatten())
    model = randomize_batchnorm(model, rng).eval()
    for batch in (1, 3):
        x = rng.normal(size=(batch, 3, 7, 5)).astype(np.float32)
        assert model._fused.launches(x.shape) == 5
        assert model._fused.unfused() == ["AdaptiveAvgPool2d"]
        y = _fused(model, q, x)
        assert y.shape == (batch, 4)
        np.testing.assert_allclose(y, _unfused(model, q, x), atol=1e-5, rtol=1e-5)


def test_upload_path(q):
    """infer() uploads each input straight from the caller's array into its input buffer: every
    result is its own input's (equal to the layers' forward), a call that fails after the upload
    leaves the next one working, a non-contiguous input arrives whole, and the caller's array is
    never written."""
    from netcl.jit.executable import Executable

    rng = np.random.default_rng(19)
    model = randomize_batchnorm(small_detector(), rng).eval()
    shape = (2, 3, 32, 32)
    xs = [rng.normal(size=shape).astype(np.float32) for _ in range(3)]
    ref = [model(Tensor.from_host(q, x)).to_host() for x in xs]
    exe = next(iter(model._fused._exe.values()))
    fresh = Executable(exe.compiled, exe.shape, model._fused.output)
    np.testing.assert_allclose(fresh.infer(xs[0]), ref[0], atol=1e-5, rtol=1e-5)
    run = fresh.run
    fresh.run = lambda x: (_ for _ in ()).throw(RuntimeError("injected"))
    with pytest.raises(RuntimeError, match="injected"):
        fresh.infer(xs[1])
    fresh.run = run
    for x, r in zip(xs[1:], ref[1:]):
        np.testing.assert_allclose(fresh.infer(x), r, atol=1e-5, rtol=1e-5)
    kept = xs[2].copy()
    strided = np.asfortranarray(xs[2])
    np.testing.assert_allclose(model.predict(strided, q), ref[2], atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(xs[2], kept)
