"""The fused path's sequence stages (netcl.jit.seq, the linear family's LayerNorm and inner-axis
forms): each equal to the unfused layers, which the layer tests check against PyTorch."""
import numpy as np
import pytest

from netcl import Tensor, models, nn

pytest.importorskip("pyopencl")


def _randomize(model, rng):
    """Every parameter random (LayerNorm's weight and bias too: folded into the next Linear)."""
    for _, t in model.named_parameters():
        t.set_(rng.normal(0, 0.5, t.shape).astype(np.float32))
    return model


def _check(model, q, x, launches=None, unfused=(), tol=2e-5):
    model.eval()
    plan = model._fused
    assert plan is not None
    if launches is not None:
        assert plan.launches(x.shape) == launches, plan
    assert plan.unfused() == list(unfused), plan
    y = plan.infer(x, q)
    y2 = model(Tensor.from_host(q, x)).to_host()
    model._fused = None
    try:
        ref = model(Tensor.from_host(q, x)).to_host()
    finally:
        model._fused = plan
    np.testing.assert_allclose(y, ref, atol=tol, rtol=tol)
    np.testing.assert_array_equal(y, y2)
    return y, ref


@pytest.mark.parametrize("embed,heads,length", [(32, 4, 64), (12, 3, 5), (10, 2, 17), (16, 1, 33), (24, 6, 16)])
def test_attention_with_layernorm_in_a_residual(q, embed, heads, length):
    """LayerNorm + input projection, the attention core (any length: the CPU kernel takes queries
    16 at a time), the output projection with the residual add: three kernels."""
    rng = np.random.default_rng(embed + length)
    model = _randomize(nn.Sequential(nn.Residual(nn.LayerNorm(embed), nn.MultiheadAttention(embed, heads))), rng)
    for batch in (1, 3):
        x = rng.normal(size=(batch, length, embed)).astype(np.float32)
        _check(model, q, x, launches=3)


def test_attention_alone_and_nan(q):
    """Without a LayerNorm before it; a NaN in one sample's input gives NaN in that sample only,
    as the unfused layers (and PyTorch) do."""
    rng = np.random.default_rng(1)
    model = _randomize(nn.Sequential(nn.MultiheadAttention(8, 2), nn.GELU()), rng)
    x = rng.normal(size=(2, 9, 8)).astype(np.float32)
    _check(model, q, x, launches=3)
    x[1, 4, 3] = np.nan
    y, ref = _check(model, q, x)
    assert np.isnan(y[1]).all() and not np.isnan(y[0]).any()


@pytest.mark.parametrize("out_f", [1, 10, 17, 33, 70, 100])
@pytest.mark.parametrize("in_f", [3, 32])
def test_layernorm_linear_any_width(q, in_f, out_f):
    """LayerNorm + Linear + activation, one kernel, at widths around the vector and block sizes,
    rows not a multiple of the row block."""
    rng = np.random.default_rng(in_f * out_f)
    model = _randomize(nn.Sequential(nn.LayerNorm(in_f, eps=1e-3), nn.Linear(in_f, out_f), nn.Tanh()), rng)
    for shape in ((1, in_f), (5, in_f), (2, 7, in_f)):
        _check(model, q, rng.normal(3, 2, size=shape).astype(np.float32), launches=1)


@pytest.mark.parametrize("out_f", [16, 96, 97, 112, 200, 300])
@pytest.mark.parametrize("ln", [False, True])
def test_linear_blocks_rows_and_output_groups(q, out_f, ln):
    """The CPU linear kernel's geometry: up to 6 float16 outputs per work-item (more in several
    groups: 7 vectors as 4 + 3), row blocks of 4-8, several blocks per work-item (2000 rows), a
    residual add with its activation on full vectors and on the tail; the GPU kernel on GPUs."""
    from netcl.jit.linear import cpu_block

    assert cpu_block(16) == (1, 8, 1) and cpu_block(96) == (6, 4, 1) and cpu_block(112) == (4, 6, 2)
    rng = np.random.default_rng(out_f + ln)
    head = [nn.LayerNorm(24)] if ln else []
    model = _randomize(nn.Sequential(*head, nn.Linear(24, out_f), nn.ReLU(),
                                     nn.Residual(nn.Linear(out_f, out_f), nn.GELU()), nn.Hardswish()), rng)
    for shape in ((1, 24), (3, 11, 24), (2000, 24)):
        _check(model, q, rng.normal(1, 2, size=shape).astype(np.float32), launches=2)


def test_layernorm_alone_and_the_mean_over_tokens(q):
    """A LayerNorm no Linear follows; Transpose(1, 2) + AdaptiveAvgPool1d(1) read in place."""
    rng = np.random.default_rng(2)
    model = _randomize(nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Transpose(2, 1), nn.AdaptiveAvgPool1d(1),
                                     nn.Flatten()), rng)
    for batch in (1, 4):
        _check(model, q, rng.normal(size=(batch, 11, 6)).astype(np.float32), launches=3)


@pytest.mark.parametrize("dims", [(1, 2), (2, 1), (-1, 1), (1, 3), (2, 3), (0, 3), (1, 1)])
def test_linear_between_two_transposes(q, dims):
    """Transpose, Linear [+ activation], the same Transpose: one kernel running the Linear along the
    axis the swap brings last (or the last one, when the swap leaves it), residual add included."""
    rng = np.random.default_rng(3)
    shape = (2, 5, 4, 6)
    other = [d % 4 for d in dims]
    axis = min(other) if 3 in other and other[0] != other[1] else 3
    body = [nn.Transpose(*dims), nn.Linear(shape[axis], shape[axis]), nn.SiLU(), nn.Transpose(*dims)]
    model = _randomize(nn.Sequential(nn.Residual(*body)), rng)
    _check(model, q, rng.normal(size=shape).astype(np.float32), launches=1)
    # a width change along that axis, no residual
    model = _randomize(nn.Sequential(nn.Transpose(*dims), nn.Linear(shape[axis], 7), nn.Transpose(*dims)), rng)
    x_shape = shape if axis == 0 else (1,) + shape[1:]  # batch 1, unless the Linear runs along the batch
    y, _ = _check(model, q, rng.normal(size=x_shape).astype(np.float32), launches=1)
    assert y.shape[axis] == 7


@pytest.mark.parametrize("dims,shape", [((1, 2), (3, 5, 7)), ((0, 2), (2, 3, 4)), ((1, 3), (2, 3, 4, 5)),
                                        ((2, 2), (2, 3, 4)), ((1, 2), (2, 1, 6))])
def test_transpose_kernel(q, dims, shape):
    """A Transpose no Linear or mean takes: one copy kernel (also when the order stays)."""
    rng = np.random.default_rng(5)
    model = _randomize(nn.Sequential(nn.Linear(shape[-1], shape[-1]), nn.Transpose(*dims)), rng)
    y, _ = _check(model, q, rng.normal(size=shape).astype(np.float32), launches=2)


@pytest.mark.parametrize("pool,shape", [(nn.AdaptiveAvgPool2d(1), (2, 3, 5, 7)), (nn.AdaptiveAvgPool1d(1), (3, 4, 9))])
def test_global_average_pool(q, pool, shape):
    rng = np.random.default_rng(6)
    model = nn.Sequential(nn.Conv2d(3, 3, 1), pool) if len(shape) == 4 else nn.Sequential(nn.Linear(9, 9), pool)
    _check(model, q, rng.normal(size=shape).astype(np.float32), launches=2)


def test_vit_tiny_is_fused_whole(q):
    """The reference transformer runs in 16 kernels, nothing unfused, at any batch, no new build
    for a new batch size."""
    from netcl import jit

    model = _randomize(models.vit_tiny(), np.random.default_rng(7)).eval()
    rng = np.random.default_rng(8)
    x = rng.normal(size=(2, 1, 8, 8)).astype(np.float32)
    _check(model, q, x, launches=16)
    builds = jit.STATS["builds"]
    _check(model, q, rng.normal(size=(5, 1, 8, 8)).astype(np.float32), launches=16)
    assert jit.STATS["builds"] == builds


@pytest.mark.parametrize("pool", [nn.MaxPool2d(3, 2, 1), nn.MaxPool2d(2, 1), nn.MaxPool2d(3), nn.MaxPool2d(2)])
def test_maxpool_no_conv_took(q, pool):
    """A MaxPool2d after a layer that is not a conv (here a Concat's identity branch would be; a
    Sigmoid keeps it apart), odd sizes, a NaN winning its windows as in PyTorch."""
    rng = np.random.default_rng(10)
    model = nn.Sequential(nn.Linear(9, 9), nn.Transpose(2, 3), pool)
    x = rng.normal(size=(2, 3, 7, 9)).astype(np.float32)
    _check(model, q, x, launches=3)
    x[1, 2, 4, 4] = np.nan
    y, ref = _check(model, q, x)
    assert np.isnan(y).sum() == np.isnan(ref).sum() > 0


@pytest.mark.parametrize("w", [16, 17, 34, 64])
def test_maxpool2_rows_of_eight_outputs(q, w):
    """2x2/2 pooling eight outputs at a time (rows of 16 inputs and more; a scalar tail after them),
    NaN in either row and either lane of a window winning it, against float64 PyTorch too."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(w)
    model = nn.Sequential(nn.Sigmoid(), nn.MaxPool2d(2))
    x = rng.normal(size=(2, 3, 5, w)).astype(np.float32)
    for n, c, h, col in ((0, 0, 0, 0), (0, 1, 1, 3), (1, 2, 2, 14), (1, 0, 3, w - 2), (1, 1, 0, 9)):
        x[n, c, h, col] = np.nan
    y, _ = _check(model, q, x, launches=1, unfused=("Sigmoid",))
    ref = torch.nn.functional.max_pool2d(torch.sigmoid(torch.from_numpy(x).double()), 2).numpy()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    assert np.isnan(y).sum() == 5
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(y[ok], ref[ok], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
@pytest.mark.parametrize("scale", [2, 3])
def test_upsample_kernel(q, mode, scale):
    rng = np.random.default_rng(11)
    model = _randomize(nn.Sequential(nn.Conv2d(2, 3, 1), nn.Sigmoid(), nn.Upsample(scale, mode)), rng)
    for shape in ((1, 2, 1, 1), (2, 2, 5, 7)):
        _check(model, q, rng.normal(size=shape).astype(np.float32), launches=2)


def test_vit_tiny_threads_get_their_own_results(q):
    """Four threads calling one eval vit_tiny (predict and model(Tensor), batch sizes 1-3): each
    gets its own result, as for the conv models."""
    from conftest import hammer_threads

    rng = np.random.default_rng(14)
    model = _randomize(models.vit_tiny(), rng).eval()
    xs = [rng.normal(size=(1 + i % 3, 1, 8, 8)).astype(np.float32) for i in range(4)]
    hammer_threads(model, q, xs, calls=40)


def _walk(module):
    yield module
    for _, child in module.named_children():
        yield from _walk(child)


def test_vit_tiny_weights_changed_after_eval_are_not_stale(q):
    """LayerNorm weights folded into the next Linear (and the attention projections) are refolded
    when they change after eval()."""
    rng = np.random.default_rng(15)
    model = _randomize(models.vit_tiny(), rng).eval()
    x = rng.normal(size=(2, 1, 8, 8)).astype(np.float32)
    y0, _ = _check(model, q, x)
    norms = [m for m in _walk(model) if isinstance(m, nn.LayerNorm)]
    attns = [m for m in _walk(model) if isinstance(m, nn.MultiheadAttention)]
    assert len(norms) == 5 and len(attns) == 2
    for layer in norms:
        layer.weight.set_(rng.normal(1, 0.3, layer.weight.shape).astype(np.float32))
        layer.bias.set_(rng.normal(0, 0.3, layer.bias.shape).astype(np.float32))
    attns[0].in_proj_weight.set_(rng.normal(0, 0.3, attns[0].in_proj_weight.shape).astype(np.float32))
    y1, _ = _check(model, q, x)
    assert np.abs(y1 - y0).max() > 1e-3
