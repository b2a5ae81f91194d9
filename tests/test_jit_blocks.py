"""The fused path inside blocks: residual adds in conv and linear epilogues, depthwise kernels,
Concat branches writing their slices, launch counts of the reference models."""

import numpy as np
import pytest

import netcl
from netcl import Tensor, jit, models, nn
from conftest import hammer_threads, randomize_batchnorm

pytest.importorskip("pyopencl")


def _sequentials(module):
    if isinstance(module, nn.Sequential):
        yield module
    for _, child in module.named_children():
        yield from _sequentials(child)


def _unfused(model, q, x):
    """The layers' own forwards: every Sequential's plan (nested ones too) switched off."""
    seqs = list(_sequentials(model))
    plans = [s._fused for s in seqs]
    for s in seqs:
        s._fused = None
    try:
        return model(Tensor.from_host(q, x)).to_host()
    finally:
        for s, p in zip(seqs, plans):
            s._fused = p


def _check(model, q, x, rtol=1e-5):
    """Fused (model(Tensor) and predict) equals the unfused layers, relative to the output's scale."""
    ref = _unfused(model, q, x)
    scale = max(1.0, float(np.abs(ref[~np.isnan(ref)]).max()) if (~np.isnan(ref)).any() else 1.0)
    for y in (model(Tensor.from_host(q, x)).to_host(), model.predict(x, q)):
        assert y.shape == ref.shape
        np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
        ok = ~np.isnan(ref)
        np.testing.assert_allclose(y[ok], ref[ok], atol=rtol * scale, rtol=rtol)
    return ref


# launches the plan enqueues per forward (unfused layers' own kernels besides, named per model)
LAUNCHES = {"mlp": (3, []), "cnn": (3, []), "detector26": (7, []), "resnet8": (11, []),
            "mobilenetv2_tiny": (18, []),
            "unet_tiny": (15, []),
            "vit_tiny": (16, [])}


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_launch_counts(name):
    plan = models.build(name).eval()._fused
    launches, unfused = LAUNCHES[name]
    assert plan.launches((1,) + models.MODELS[name].input_shape) == launches
    assert plan.unfused() == unfused
    if name == "detector26":
        assert launches <= 8


def test_launch_count_is_what_runs(q):
    netcl.manual_seed(0)
    model = models.resnet8().eval()
    x = np.zeros((2, 3, 32, 32), np.float32)
    model(Tensor.from_host(q, x))
    before = jit.STATS["launches"]
    model(Tensor.from_host(q, x))
    assert jit.STATS["launches"] - before == model._fused.launches(x.shape) == 11


REFERENCE = ["mlp", "cnn", "detector26", "resnet8", "mobilenetv2_tiny", "unet_tiny", "vit_tiny"]


def _reference_case(name, batch, seed=0):
    rng = np.random.default_rng(seed + batch)
    netcl.manual_seed(seed)
    model = randomize_batchnorm(models.build(name), rng).eval()
    x = rng.normal(size=(batch,) + models.MODELS[name].input_shape).astype(np.float32)
    return model, x


@pytest.mark.parametrize("name", REFERENCE)
@pytest.mark.parametrize("batch", [1, 3])
def test_reference_models_fused_equal_unfused(q, name, batch):
    model, x = _reference_case(name, batch)
    _check(model, q, x)


@pytest.mark.slow  # PoCL compiles the GPU family's local-memory kernels slowly
@pytest.mark.parametrize("name", REFERENCE)
@pytest.mark.parametrize("batch", [1, 3])
def test_reference_models_gpu_families(q, monkeypatch, name, batch):
    monkeypatch.setenv("NETCL_JIT_CLASS", "gpu")
    model, x = _reference_case(name, batch)
    _check(model, q, x)


# -- residual epilogues ---------------------------------------------------------------------------
def _res_net(act_after, shortcut, wino):
    """A residual block ending in a conv + BN (3x3: Winograd or direct; 1x1: direct), with an
    identity shortcut, or a stride-2 body with a 1x1 stride-2 conv + BN shortcut."""
    ks = 3 if wino else 1
    if shortcut:
        block = nn.Residual(nn.Conv2d(6, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                            nn.Conv2d(8, 8, ks, padding=ks // 2), nn.BatchNorm2d(8),
                            shortcut=nn.Sequential(nn.Conv2d(6, 8, 1, stride=2, bias=False), nn.BatchNorm2d(8)))
    else:
        block = nn.Residual(nn.Conv2d(6, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                            nn.Conv2d(8, 6, ks, padding=ks // 2), nn.BatchNorm2d(6))
    c = 8 if shortcut else 6
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.Tanh(), block,
                         *([nn.LeakyReLU(0.2)] if act_after else []), nn.Conv2d(c, 4, 1))


@pytest.mark.parametrize("act_after", [False, True], ids=["no-act", "act"])
@pytest.mark.parametrize("shortcut", [False, True], ids=["identity", "conv-bn-stride2"])
@pytest.mark.parametrize("wino", ["0", "2"])
def test_residual_in_the_conv_epilogue(q, monkeypatch, act_after, shortcut, wino):
    monkeypatch.setenv("NETCL_CPU_WINO", wino)
    rng = np.random.default_rng(3)
    netcl.manual_seed(3)
    model = randomize_batchnorm(_res_net(act_after, shortcut, wino != "0"), rng).eval()
    text = repr(model._fused)
    assert ("BatchNorm2d+add+act2, " if act_after else "BatchNorm2d+add, ") in text, text
    assert "Add" not in text  # no separate add stage
    assert model._fused.launches((1, 3, 12, 12)) == (5 if shortcut else 4)
    for batch in (1, 3):
        x = rng.normal(size=(batch, 3, 12, 12)).astype(np.float32)
        _check(model, q, x)


def test_residual_after_a_pool_is_an_add_stage(q):
    rng = np.random.default_rng(4)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1),
                          nn.Residual(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      shortcut=nn.MaxPool2d(2)),
                          nn.Sigmoid()).eval()
    assert "Add+act3" in repr(model._fused)
    _check(model, q, rng.normal(size=(2, 3, 8, 8)).astype(np.float32))


def test_residual_in_the_linear_epilogue(q):
    rng = np.random.default_rng(5)
    model = nn.Sequential(nn.Linear(7, 9), nn.Residual(nn.Linear(9, 5), nn.GELU(), nn.Linear(5, 9)), nn.ReLU()).eval()
    assert repr(model._fused) == "FusedPlan(Linear, Linear+act5, Linear+add+act1)"
    _check(model, q, rng.normal(size=(3, 7)).astype(np.float32))


# -- depthwise ------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(11, 9), (16, 16)], ids=["odd", "vectors"])  # the generic kernel, the CPU direct one
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("mult", [1, 2])
def test_depthwise_with_nan(q, stride, mult, size):
    rng = np.random.default_rng(6 + stride)
    netcl.manual_seed(6)
    body = [nn.Conv2d(12, 12 * mult, 3, stride=stride, padding=1, groups=12, bias=False), nn.BatchNorm2d(12 * mult),
            nn.ReLU6()]
    model = randomize_batchnorm(nn.Sequential(nn.Conv2d(3, 12, 1), *body, nn.Conv2d(12 * mult, 5, 1)), rng).eval()
    assert "DwConv2d+BatchNorm2d+act8" in repr(model._fused)
    for batch in (1, 3):
        x = rng.normal(size=(batch, 3) + size).astype(np.float32)
        x[0, 1, 4, 3] = np.nan
        ref = _check(model, q, x)
        assert np.isnan(ref).any() and not np.isnan(ref).all()


def test_depthwise_residual_and_dilation(q):
    """A block ending in a depthwise conv adds in its epilogue; dilation 2; unpadded input border."""
    rng = np.random.default_rng(8)
    model = nn.Sequential(nn.Sigmoid(), nn.Residual(nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8),
                                                    nn.BatchNorm2d(8)), nn.Hardswish())
    model = randomize_batchnorm(model, rng).eval()
    assert "DwConv2d+BatchNorm2d+add+act9" in repr(model._fused)
    _check(model, q, rng.normal(size=(2, 8, 9, 7)).astype(np.float32))


# -- concat ---------------------------------------------------------------------------------------
def test_concat_of_fused_branches_writes_slices(q):
    rng = np.random.default_rng(9)
    netcl.manual_seed(9)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(),
                          nn.Concat(nn.Sequential(nn.Conv2d(6, 5, 3, padding=1), nn.BatchNorm2d(5), nn.ReLU()),
                                    nn.Conv2d(6, 4, 1),
                                    nn.Sequential(nn.Conv2d(6, 6, 3, padding=1, groups=6), nn.SiLU()),
                                    nn.Identity(), dim=1),
                          nn.Conv2d(21, 3, 3, padding=1))
    model = randomize_batchnorm(model, rng).eval()
    text = repr(model._fused)
    assert text.count("CopySlice") == 1  # only the Identity branch copies
    assert model._fused.launches((1, 3, 10, 10)) == 6
    for batch in (1, 3):
        _check(model, q, rng.normal(size=(batch, 3, 10, 10)).astype(np.float32))


@pytest.mark.parametrize("wino", ["0", "2", "4"])
def test_readers_of_different_paddings_share_the_widest_border(q, monkeypatch, wino):
    """One value read by a 5x5 (padding 2), a 3x3 stride 2 (1), a depthwise 3x3 (1) and a 1x1 (0)
    convolution: it is stored with the widest border, 2, and every reader starts inside it
    (no bounds checks); each branch equals the unfused layers, in every CPU family."""
    monkeypatch.setenv("NETCL_CPU_WINO", wino)
    rng = np.random.default_rng(12)
    netcl.manual_seed(12)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Concat(nn.Sequential(nn.Conv2d(8, 4, 5, padding=2), nn.MaxPool2d(2)),
                                    nn.Conv2d(8, 4, 3, stride=2, padding=1),
                                    nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU6(), nn.MaxPool2d(2)),
                                    nn.Conv2d(8, 4, 1, stride=2)),
                          nn.Conv2d(20, 3, 3, padding=1))
    model = randomize_batchnorm(model, rng).eval()
    stages = model._fused.stages
    readers = [s for s in stages if isinstance(s, jit.stages.ConvStage) and s.src == stages[0].dst]
    assert len(readers) == 4 and {s.in_border for s in readers} == {2}
    assert stages[0].out_border == 2
    for batch in (1, 3):
        _check(model, q, rng.normal(size=(batch, 3, 32, 32)).astype(np.float32))


def test_nested_blocks_keep_every_branch(q):
    """A residual whose body ends in a Concat, a Concat with a Concat branch: an add or a slice is
    never given to one branch's conv alone."""
    rng = np.random.default_rng(11)
    inner = nn.Concat(nn.Conv2d(4, 2, 3, padding=1), nn.Conv2d(4, 2, 1))
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Residual(inner), nn.ReLU(),
                          nn.Concat(nn.Concat(nn.Conv2d(4, 3, 1), nn.Conv2d(4, 1, 3, padding=1)), nn.Conv2d(4, 2, 1)),
                          nn.Conv2d(6, 2, 3, padding=1)).eval()
    assert "Add+act1" in repr(model._fused)
    _check(model, q, rng.normal(size=(2, 3, 7, 6)).astype(np.float32))


def test_concat_along_another_axis_copies(q):
    rng = np.random.default_rng(10)
    model = nn.Sequential(nn.Linear(4, 6), nn.Concat(nn.Linear(6, 6), nn.Tanh(), dim=-1), nn.Linear(12, 2)).eval()
    _check(model, q, rng.normal(size=(3, 5, 4)).astype(np.float32))


# -- batch sizes and threads on resnet8 -----------------------------------------------------------
def test_resnet8_new_batch_sizes_build_nothing(q):
    rng = np.random.default_rng(11)
    netcl.manual_seed(11)
    model = randomize_batchnorm(models.resnet8(), rng).eval()
    builds = None
    for n in (1, 5, 2, 17, 3):
        x = rng.normal(size=(n, 3, 32, 32)).astype(np.float32)
        ref = _unfused(model, q, x)
        np.testing.assert_allclose(model.predict(x, q), ref, atol=1e-5, rtol=1e-5)
        builds = jit.STATS["builds"] if builds is None else builds
    assert jit.STATS["builds"] == builds


def test_resnet8_threads_get_their_own_results(q):
    rng = np.random.default_rng(12)
    netcl.manual_seed(12)
    model = randomize_batchnorm(models.resnet8(), rng).eval()
    xs = [rng.normal(size=(1 + i % 3, 3, 32, 32)).astype(np.float32) for i in range(4)]
    hammer_threads(model, q, xs, calls=60)


def test_resnet8_weights_changed_after_eval_are_not_stale(q):
    rng = np.random.default_rng(13)
    netcl.manual_seed(13)
    model = randomize_batchnorm(models.resnet8(), rng).eval()
    x = rng.normal(size=(2, 3, 32, 32)).astype(np.float32)
    y0 = model.predict(x, q)
    netcl.manual_seed(14)
    model.load_state_dict(randomize_batchnorm(models.resnet8(), np.random.default_rng(14)).state_dict())
    assert np.abs(model.predict(x, q) - y0).max() > 1e-4
    _check(model, q, x)
