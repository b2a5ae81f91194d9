"""Every layer's forward and backward (dx and every parameter gradient) against PyTorch CPU in
float64, and the core layers also against plain numpy references, over awkward shapes:
stride 2, padding, odd sizes, batch 1, channel counts that are not multiples of 4."""
import numpy as np
import pytest
from conftest import assert_close

from netcl import Tensor, nn, ops


def run_netcl(q, layer, x, dy):
    """Forward x, backward dy: (y, dx, {param name: grad}) as float32 numpy arrays."""
    y = layer(Tensor.from_host(q, x))
    dx = layer.backward(Tensor.from_host(q, dy))
    return y.to_host(), dx.to_host(), {k: p.grad.to_host() for k, p in layer.named_parameters()}


def run_torch(torch, mod, x, dy, grads_of=None):
    """The same in float64 PyTorch; grads_of maps netcl names to torch parameters."""
    mod = mod.double()
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y = mod(xt)
    y.backward(torch.tensor(dy, dtype=torch.float64))
    params = dict(mod.named_parameters())
    return y.detach().numpy(), xt.grad.numpy(), {k: params[k].grad.numpy() for k in (grads_of or params)}


def compare(record_error, got, ref, rtol=1e-5, transpose=(), dx_atol=1e-6):
    """Assert forward, dx and parameter gradients close; record the max errors."""
    (y, dx, g), (ry, rdx, rg) = got, ref
    assert set(g) == set(rg), f"parameter names {sorted(g)} != {sorted(rg)}"
    fwd = assert_close(y, ry, rtol, what="forward")
    bwd = [assert_close(dx, rdx, rtol, atol=dx_atol, what="dx")]
    for k in g:
        bwd.append(assert_close(g[k], rg[k].T if k in transpose else rg[k], rtol, what=f"grad {k}"))
    record_error(fwd, max(bwd))


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# -- PyTorch references -----------------------------------------------------------------
@pytest.mark.parametrize("shape,fin,fout,bias", [((4, 7), 7, 5, True), ((1, 16), 16, 10, True),
                                                 ((3, 33), 33, 17, False), ((2, 3, 6), 6, 9, True),
                                                 ((1, 5, 7), 7, 3, False), ((2, 3, 4, 6), 6, 9, True),
                                                 ((1, 1, 3, 5), 5, 2, True)])
def test_linear_vs_torch(queue, rng, torch, record_error, shape, fin, fout, bias):
    layer = nn.Linear(fin, fout, bias=bias)
    ref = torch.nn.Linear(fin, fout, bias=bias)
    with torch.no_grad():  # netcl keeps weight as (in, out): y = x @ W + b
        ref.weight.copy_(torch.tensor(layer.weight.to_host().T))
        if bias:
            ref.bias.copy_(torch.tensor(layer.bias.to_host()))
    x = rand(rng, *shape)
    dy = rand(rng, *shape[:-1], fout)
    compare(record_error, run_netcl(queue, layer, x, dy), run_torch(torch, ref, x, dy), transpose=("weight",))


CONV_CASES = [  # N, C, H, W, K, k, stride, padding, bias
    (2, 3, 7, 9, 5, 3, 1, 1, True),
    (1, 5, 8, 8, 6, 3, 2, 1, False),
    (3, 4, 9, 7, 7, 5, 2, 2, True),
    (2, 6, 5, 5, 3, 1, 1, 0, True),
    (2, 3, 10, 11, 8, 1, 2, 0, False),
    (1, 1, 8, 8, 16, 3, 1, 1, True),
]


@pytest.mark.parametrize("n,c,h,w,k,ks,s,p,bias", CONV_CASES)
def test_conv2d_vs_torch(queue, rng, torch, record_error, n, c, h, w, k, ks, s, p, bias):
    layer = nn.Conv2d(c, k, ks, stride=s, padding=p, bias=bias)
    ref = torch.nn.Conv2d(c, k, ks, stride=s, padding=p, bias=bias)
    ref.load_state_dict({name: torch.tensor(a) for name, a in layer.state_dict().items()})
    x = rand(rng, n, c, h, w)
    dy = rand(rng, *layer.output_shape(x.shape))
    compare(record_error, run_netcl(queue, layer, x, dy), run_torch(torch, ref, x, dy))


def test_conv2d_gpu_gemm_vs_torch(queue, rng, torch, record_error, monkeypatch):
    """Conv2d trained through ops.gemm's GPU path (gemm_tile, forced on this device): the batched
    forward with bias, the split-K weight gradient and the data gradient."""
    from netcl import ops

    monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    monkeypatch.setattr(ops, "_compute_units", {queue.device.int_ptr: 8})
    test_conv2d_vs_torch(queue, rng, torch, record_error, 2, 4, 9, 9, 40, 3, 1, 1, True)


@pytest.mark.parametrize("shape,momentum", [((4, 3, 5, 5), 0.1), ((1, 6, 3, 7), 0.3), ((8, 5, 1, 1), 0.1),
                                            ((2, 17, 4, 3), 0.5)])
def test_batchnorm2d_vs_torch(queue, rng, torch, record_error, shape, momentum):
    check_batchnorm(queue, rng, torch, record_error, shape, momentum)


@pytest.fixture
def gpu_class(queue, monkeypatch):
    """The "gpu" device class on this device: the layers launch their GPU kernels."""
    from netcl import ops

    monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (2, 17, 4, 3)])
def test_batchnorm2d_gpu_class_vs_torch(queue, rng, torch, record_error, gpu_class, shape):
    check_batchnorm(queue, rng, torch, record_error, shape, 0.1)


@pytest.mark.parametrize("cls", ["native", "gpu"])
def test_batchnorm2d_long_rows_vs_torch(queue, rng, torch, record_error, monkeypatch, cls):
    """Rows of vectors and a tail (37), element-wise chunks that end inside rows."""
    from netcl import ops

    if cls == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    check_batchnorm(queue, rng, torch, record_error, (3, 4, 20, 37), 0.1)


@pytest.mark.parametrize("shape,part_len,offset", [((3, 5, 7, 9), 37, 0.5), ((5, 4, 13, 11), 100, 0.5),
                                                   ((70, 3, 1, 1), 37, 0.5), ((2, 3, 16, 16), 64, 30.0)])
def test_batchnorm2d_many_parts_vs_torch(queue, rng, torch, record_error, monkeypatch, shape, part_len, offset):
    """Statistics and gradients reduced over several parts per channel (a tail part; parts
    shorter than a work-group; rows shorter than a work-group's stride; data far from zero)."""
    from netcl.nn import norm

    monkeypatch.setattr(norm, "PART_LEN", {"cpu": part_len, "gpu": part_len})
    check_batchnorm(queue, rng, torch, record_error, shape, 0.1, offset)


def check_batchnorm(queue, rng, torch, record_error, shape, momentum, offset=0.5):
    c = shape[1]
    layer = nn.BatchNorm2d(c, eps=1e-4, momentum=momentum)
    ref = torch.nn.BatchNorm2d(c, eps=1e-4, momentum=momentum).double()
    gamma, beta = rng.uniform(0.5, 1.5, c).astype(np.float32), rand(rng, c)
    layer.weight.set_(gamma)
    layer.bias.set_(beta)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(gamma))
        ref.bias.copy_(torch.tensor(beta))
    # two training steps (batch statistics; running stats with the unbiased variance), then eval
    for step in range(2):
        x = (rand(rng, *shape) * 2 + offset).astype(np.float32)
        dy = rand(rng, *shape)
        for p in layer.parameters():
            p.grad = None
        ref.zero_grad()
        compare(record_error, run_netcl(queue, layer, x, dy), run_torch(torch, ref, x, dy))
    for name in ("running_mean", "running_var"):
        assert_close(layer.state_dict()[name], getattr(ref, name).numpy(), 1e-5, what=name)
    # eval: running statistics, and (frozen-BN fine-tuning) gradients through them as constants
    layer.eval()
    ref.eval()
    layer.zero_grad()
    ref.zero_grad()
    x, dy = rand(rng, *shape), rand(rng, *shape)
    compare(record_error, run_netcl(queue, layer, x, dy), run_torch(torch, ref, x, dy))


ACTIVATIONS = [("ReLU", {}), ("LeakyReLU", {"negative_slope": 0.01}), ("LeakyReLU", {"negative_slope": 0.2}),
               ("Sigmoid", {}), ("Tanh", {}), ("GELU", {}), ("GELU", {"approximate": "tanh"}), ("SiLU", {}),
               ("ReLU6", {}), ("Hardswish", {}), ("Hardsigmoid", {})]


@pytest.mark.parametrize("name,kw", ACTIVATIONS)
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 13)])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_activation_vs_torch(queue, rng, torch, record_error, name, kw, shape, mode):
    x = rand(rng, *shape) * 3
    dy = rand(rng, *shape)
    ref = getattr(torch.nn, name)(**kw)
    layer = getattr(nn, name)(**kw).train(mode == "train")
    compare(record_error, run_netcl(queue, layer, x, dy), run_torch(torch, ref, x, dy))


@pytest.mark.parametrize("name,kw", ACTIVATIONS)
def test_activation_many_chunks_vs_torch(queue, rng, torch, record_error, name, kw):
    """A tensor of many CPU work-items' chunks (act_cpu.cl), its size not a multiple of 16."""
    test_activation_vs_torch(queue, rng, torch, record_error, name, kw, (3, 5, 41, 53), "train")


@pytest.mark.parametrize("name,kw", ACTIVATIONS)
def test_activation_at_its_kinks_vs_torch(queue, torch, record_error, name, kw):
    """The piecewise activations' boundaries (-3, 0, 3, 6) and far tails give PyTorch's values and gradients."""
    x = np.array([-100, -6, -3, -1e-3, 0, 1e-3, 3, 6, 6.5, 100, -20, 20], np.float32)
    dy = np.linspace(0.5, 1.5, x.size).astype(np.float32)
    compare(record_error, run_netcl(queue, getattr(nn, name)(**kw), x[None], dy[None]),
            run_torch(torch, getattr(torch.nn, name)(**kw), x[None], dy[None]))


def test_gelu_approximate_is_checked():
    for bad in ("erf", "TANH", ""):
        with pytest.raises(ValueError, match="approximate must be one of"):
            nn.GELU(approximate=bad)
    for bad in (None, 1, True):
        with pytest.raises(TypeError, match="approximate must be a string"):
            nn.GELU(approximate=bad)


@pytest.mark.parametrize("shape", [(4, 7), (2, 5, 13), (1, 3, 4, 33), (3, 200), (2, 1), (8, 64, 32)])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("cls", ["native", "gpu"])  # on a CPU: norm_cpu.cl's kernels, and norm.cl's forced
def test_layernorm_vs_torch(queue, rng, torch, record_error, monkeypatch, shape, mode, cls):
    if cls == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    d = shape[-1]
    layer = nn.LayerNorm(d, eps=1e-4).train(mode == "train")
    ref = torch.nn.LayerNorm(d, eps=1e-4)
    gamma, beta = rng.uniform(0.5, 1.5, d).astype(np.float32), rand(rng, d)
    layer.load_state_dict({"weight": gamma, "bias": beta})
    ref.load_state_dict({"weight": torch.tensor(gamma), "bias": torch.tensor(beta)})
    x = rand(rng, *shape) * 2 + 1
    dy = rand(rng, *shape)
    # d == 1: dx is exactly 0 (dy minus its own mean), times 1/sqrt(eps) = 100: a GPU compiler's fused
    # multiply-adds leave ~1e-6 there (seen on the H200), which is rounding, not an error
    compare(record_error, run_netcl(queue, layer, x, dy), run_torch(torch, ref, x, dy),
            dx_atol=1e-5 if d == 1 else 1e-6)


def test_layernorm_accumulates_gradients_and_takes_pytorch_arguments(queue, rng):
    layer = nn.LayerNorm((6,))
    assert layer.config() == {"normalized_shape": 6, "eps": 1e-5} and layer.output_shape((2, 3, 6)) == (2, 3, 6)
    x, dy = rand(rng, 3, 6), rand(rng, 3, 6)
    once = run_netcl(queue, layer, x, dy)[2]
    twice = run_netcl(queue, layer, x, dy)[2]  # no zero_grad: the second backward adds
    for k in once:
        np.testing.assert_allclose(twice[k], 2 * once[k], rtol=1e-6)
    for bad, err in (((2, 3), ValueError), (0, ValueError), (2.5, TypeError)):
        with pytest.raises(err):
            nn.LayerNorm(bad)
    with pytest.raises(ValueError, match=r"expects input \(\.\.\., 6\)"):
        layer.output_shape((2, 5))
    for eps in (0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="eps"):
            nn.LayerNorm(4, eps=eps)
    with pytest.raises(TypeError, match="eps must be a number"):
        nn.LayerNorm(4, eps=True)


class _TorchTranspose:
    def __init__(self, torch, d0, d1):
        self.torch, self.d = torch, (d0, d1)

    def double(self):
        return self

    def named_parameters(self):
        return []

    def __call__(self, x):
        return x.transpose(*self.d)


@pytest.mark.parametrize("shape,d0,d1", [((2, 3, 4, 5), 1, 3), ((2, 3, 4, 5), 0, 2), ((2, 3, 4, 5), -1, -2),
                                         ((3, 5, 7), 2, 2), ((1, 7, 5), 1, 2), ((2, 1, 5), 1, 2),
                                         ((3, 4, 1, 6), 1, 3), ((1, 9, 64), 2, 1)])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("cls", ["native", "gpu"])  # on a CPU: its rows kernel, and the GPU class's
def test_transpose_vs_torch(queue, rng, torch, record_error, monkeypatch, shape, d0, d1, mode, cls):
    if cls == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    layer = nn.Transpose(d0, d1).train(mode == "train")
    x = rand(rng, *shape)
    dy = rand(rng, *layer.output_shape(shape))
    got, ref = run_netcl(queue, layer, x, dy), run_torch(torch, _TorchTranspose(torch, d0, d1), x, dy)
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])
    compare(record_error, got, ref)


@pytest.mark.parametrize("shape,start,end", [((2, 3, 4, 5), 2, 3), ((2, 3, 4, 5), 1, 2), ((2, 3, 4, 5), 0, -1),
                                             ((2, 3, 4, 5), -3, -2), ((1, 3, 5), 1, 1), ((2, 3, 4, 5), 1, -1)])
def test_flatten_dims_vs_torch(queue, rng, torch, record_error, shape, start, end):
    layer = nn.Flatten(start, end)
    x = rand(rng, *shape)
    dy = rand(rng, *layer.output_shape(shape))
    got, ref = run_netcl(queue, layer, x, dy), run_torch(torch, torch.nn.Flatten(start, end), x, dy)
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])
    compare(record_error, got, ref)


def test_shape_layers_refuse_what_does_not_fit():
    with pytest.raises(ValueError, match="out of range"):
        nn.Transpose(1, 4).output_shape((2, 3, 4))
    with pytest.raises(ValueError, match="out of range"):
        nn.Flatten(1, 5).output_shape((2, 3, 4))
    with pytest.raises(ValueError, match="start_dim comes after end_dim"):
        nn.Flatten(2, 1).output_shape((2, 3, 4, 5))
    with pytest.raises(TypeError):
        nn.Transpose(1.5, 2)
    assert nn.Flatten().output_shape((4,)) == (4, 1)  # the default keeps netcl's behaviour on 1-D input


ADAPTIVE_CASES = [  # layer, input shape, output_size
    ("AdaptiveAvgPool2d", (2, 3, 7, 5), 1), ("AdaptiveAvgPool2d", (2, 3, 7, 5), 3),
    ("AdaptiveAvgPool2d", (1, 4, 8, 8), 4), ("AdaptiveAvgPool2d", (2, 3, 7, 5), 9),  # larger than the input
    ("AdaptiveAvgPool2d", (1, 5, 13, 11), 2), ("AdaptiveAvgPool2d", (3, 2, 6, 6), 6),
    ("AdaptiveAvgPool1d", (2, 3, 11), 1), ("AdaptiveAvgPool1d", (2, 3, 11), 4), ("AdaptiveAvgPool1d", (1, 5, 6), 3),
    ("AdaptiveAvgPool1d", (2, 2, 5), 7), ("AdaptiveAvgPool2d", (3, 5, 9, 12), 1),  # planes of vectors and a tail
]


@pytest.mark.parametrize("name,shape,size", ADAPTIVE_CASES)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_adaptive_avg_pool_vs_torch(queue, rng, torch, record_error, name, shape, size, mode):
    layer = getattr(nn, name)(size).train(mode == "train")
    x = rand(rng, *shape)
    dy = rand(rng, *layer.output_shape(shape))
    compare(record_error, run_netcl(queue, layer, x, dy), run_torch(torch, getattr(torch.nn, name)(size), x, dy))


@pytest.mark.parametrize("shape", [(2, 3, 7, 5), (64, 64, 8, 8), (1, 1, 1, 1), (2, 3, 11)])
def test_global_avg_pool_cpu_kernel_equals_the_general_one(queue, rng, monkeypatch, shape):
    """Global average pooling's CPU forward (planes per work-item) adds each plane in the order the
    general kernel does: on PoCL the same values bit for bit; another compiler may contract or
    vectorise the two kernels' sums differently (Intel's: float32 noise apart)."""
    layer = (nn.AdaptiveAvgPool2d if len(shape) == 4 else nn.AdaptiveAvgPool1d)(1)
    x = rand(rng, *shape)
    y = layer(Tensor.from_host(queue, x)).to_host()
    monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    general = layer(Tensor.from_host(queue, x)).to_host()
    if "portable computing language" in queue.device.platform.name.lower():
        assert np.array_equal(y, general)
    else:  # float32 noise of a mean (near zero: ulps would mislead)
        np.testing.assert_allclose(y, general, rtol=0, atol=1e-6 * float(np.abs(x).max()))


def test_adaptive_avg_pool_checks_rank_and_size():
    with pytest.raises(ValueError, match=r"4-D input \(N, C, H, W\)"):
        nn.AdaptiveAvgPool2d(1).output_shape((2, 3, 4))
    with pytest.raises(ValueError, match=r"3-D input \(N, C, L\)"):
        nn.AdaptiveAvgPool1d(1).output_shape((2, 3, 4, 4))
    with pytest.raises(ValueError, match="output_size must be >= 1"):
        nn.AdaptiveAvgPool2d(0)
    assert nn.AdaptiveAvgPool2d((2, 2)).output_size == 2


POOL_CASES = [  # shape, kernel, stride, padding
    ((2, 3, 8, 8), 2, None, 0),
    ((1, 5, 9, 11), 3, 2, 1),  # odd sizes, stride != kernel, overlapping windows, padding
    ((2, 3, 7, 7), 3, 1, 1),  # stride 1: every input in up to 9 windows
    ((2, 6, 8, 9), 2, 1, 0),
    ((1, 3, 13, 12), 5, 3, 2),
    ((3, 2, 5, 5), 1, 2, 0),
    ((2, 3, 20, 37), 2, None, 0),  # 2x2 on CPUs: vectors of 8 windows, odd width, a scalar tail
    ((1, 2, 17, 24), 2, 2, 0),  # odd height, vectors of 8 then 4
]


@pytest.mark.parametrize("kind", ["MaxPool2d", "AvgPool2d"])
@pytest.mark.parametrize("shape,ks,s,p", POOL_CASES)
def test_pool_vs_torch(queue, rng, torch, record_error, kind, shape, ks, s, p):
    x = rand(rng, *shape)
    layer = getattr(nn, kind)(ks, stride=s, padding=p)
    ref = getattr(torch.nn, kind)(ks, stride=s, padding=p)  # AvgPool2d: count_include_pad=True by default
    dy = rand(rng, *layer.output_shape(shape))
    compare(record_error, run_netcl(queue, layer, x, dy), run_torch(torch, ref, x, dy))


CEIL_CASES = [((2, 3, 9, 11), 2, 2, 0), ((1, 4, 55, 55), 3, 2, 0), ((2, 2, 7, 10), 3, 2, 1), ((1, 3, 5, 5), 2, 3, 0),
              ((2, 3, 17, 33), 2, 2, 0)]  # odd sizes (the last window past the input), a stride over the kernel


@pytest.mark.parametrize("shape,ks,s,p", CEIL_CASES)
def test_maxpool_ceil_mode_vs_torch(queue, rng, torch, record_error, shape, ks, s, p):
    """ceil_mode's extra row and column (squeezenet, googlenet): training, the fused path, ONNX."""
    x = rand(rng, *shape)
    layer, ref = nn.MaxPool2d(ks, s, p, ceil_mode=True), torch.nn.MaxPool2d(ks, s, p, ceil_mode=True)
    assert layer.output_shape(shape) == tuple(ref(torch.zeros(shape)).shape)
    dy = rand(rng, *layer.output_shape(shape))
    compare(record_error, run_netcl(queue, layer, x, dy), run_torch(torch, ref, x, dy))
    seq = nn.Sequential(nn.Conv2d(shape[1], 4, 1), nn.ReLU(), nn.MaxPool2d(ks, s, p, ceil_mode=True)).to(queue).eval()
    unfused = seq(Tensor.from_host(queue, x)).to_host()
    np.testing.assert_allclose(seq.predict(x, queue), unfused, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape,ks,s,p", [POOL_CASES[0], POOL_CASES[-2]])
def test_pool_gpu_class_vs_torch(queue, rng, torch, record_error, gpu_class, shape, ks, s, p):
    test_pool_vs_torch(queue, rng, torch, record_error, "MaxPool2d", shape, ks, s, p)


@pytest.mark.parametrize("cls", ["native", "gpu"])
def test_maxpool_ties_nan_inf_vs_torch(queue, rng, torch, monkeypatch, cls):
    """MaxPool2d(2)'s winner where values tie (the first in row-major order), are NaN (a later NaN
    wins) or infinite, in every lane of the CPU kernels' vectors and tails: the same output and the
    same gradient routing as PyTorch."""
    from netcl import ops

    if cls == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    x = rng.integers(-2, 3, (2, 3, 6, 30)).astype(np.float32)  # small integers: many ties
    flat = x.reshape(-1)
    for v in (np.nan, np.inf, -np.inf):
        flat[rng.choice(flat.size, 40, replace=False)] = v
    dy = rand(rng, 2, 3, 3, 15)
    y, dx, _ = run_netcl(queue, nn.MaxPool2d(2), x, dy)
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.nn.MaxPool2d(2)(xt)
    yt.backward(torch.tensor(dy))
    assert np.array_equal(y, yt.detach().numpy(), equal_nan=True)
    assert np.array_equal(dx, xt.grad.numpy())


@pytest.mark.parametrize("shape,dim", [((4, 10), 1), ((3, 7), -1), ((2, 3, 4, 5), 1), ((2, 3, 4, 5), -1),
                                       ((2, 3, 4, 5), 2), ((1, 1000), 1), ((3, 2, 16), -1), ((2, 37), 1)])
@pytest.mark.parametrize("cls", ["native", "gpu"])  # on a CPU: lines in vectors where contiguous, and the GPU class's
def test_softmax_vs_torch(queue, rng, torch, record_error, monkeypatch, shape, dim, cls):
    if cls == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    x = rand(rng, *shape) * 4
    dy = rand(rng, *shape)
    compare(record_error, run_netcl(queue, nn.Softmax(dim), x, dy), run_torch(torch, torch.nn.Softmax(dim), x, dy))


@pytest.mark.parametrize("n,L,e,h", [(2, 5, 8, 2), (1, 7, 12, 3), (3, 4, 16, 4), (2, 9, 6, 1)])
@pytest.mark.parametrize("cls", ["native", "gpu"])  # on a CPU: the heads' row copies, and the GPU class's
def test_multihead_attention_vs_torch(queue, rng, torch, record_error, monkeypatch, n, L, e, h, cls):
    if cls == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    layer = nn.MultiheadAttention(e, h)
    ref = torch.nn.MultiheadAttention(e, h, batch_first=True)
    assert set(layer.state_dict()) == set(ref.state_dict())  # same names: torch checkpoints load as they are
    sd = {k: rand(rng, *a.shape) * 0.5 for k, a in layer.state_dict().items()}  # nonzero biases too
    for k, t in layer.named_parameters():
        t.set_(sd[k])
    ref.load_state_dict({k: torch.tensor(a) for k, a in sd.items()})

    class SelfAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = ref

        def forward(self, x):
            return self.m(x, x, x, need_weights=False)[0]

    x = rand(rng, n, L, e)
    dy = rand(rng, n, L, e)
    names = {k: "m." + k for k in sd}
    got = run_netcl(queue, layer, x, dy)
    y, dx, g = run_torch(torch, SelfAttention(), x, dy, grads_of=list(names.values()))
    compare(record_error, got, (y, dx, {k: g[v] for k, v in names.items()}))


def test_flatten(queue, rng, record_error):
    x, dy = rand(rng, 2, 3, 4, 5), rand(rng, 2, 60)
    y, dx, g = run_netcl(queue, nn.Flatten(), x, dy)
    assert g == {}
    np.testing.assert_array_equal(y, x.reshape(2, 60))
    np.testing.assert_array_equal(dx, dy.reshape(x.shape))
    record_error(0.0, 0.0)


def test_identity(queue, rng, record_error):
    x, dy = rand(rng, 3, 1, 5), rand(rng, 3, 1, 5)
    y, dx, g = run_netcl(queue, nn.Identity(), x, dy)
    assert g == {}
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(dx, dy)
    record_error(0.0, 0.0)


def test_dropout(queue, rng):
    p, shape = 0.3, (64, 50, 10)
    x = rng.uniform(1.0, 2.0, shape).astype(np.float32)
    layer = nn.Dropout(p)
    y = layer(Tensor.from_host(queue, x)).to_host()
    kept = y != 0
    assert abs(kept.mean() - (1 - p)) < 0.01  # 32000 draws: 5 sigma is 0.013
    np.testing.assert_allclose(y[kept], x[kept] / (1 - p), rtol=1e-6)
    dy = rand(rng, *shape)
    dx = layer.backward(Tensor.from_host(queue, dy)).to_host()
    np.testing.assert_allclose(dx, np.where(kept, dy / (1 - p), 0), rtol=1e-6)  # the forward's mask
    y2 = layer(Tensor.from_host(queue, x)).to_host()
    assert 0 < np.mean(kept != (y2 != 0))  # a fresh mask each call
    # eval: identity, both ways
    layer.eval()
    np.testing.assert_array_equal(layer(Tensor.from_host(queue, x)).to_host(), x)
    np.testing.assert_array_equal(layer.backward(Tensor.from_host(queue, dy)).to_host(), dy)
    for p_edge, expect in ((0.0, x), (1.0, np.zeros_like(x))):
        np.testing.assert_array_equal(nn.Dropout(p_edge)(Tensor.from_host(queue, x)).to_host(), expect)


# -- numpy references (no PyTorch needed) ----------------------------------------------
def np_conv2d(x, w, b, s, p):
    """Direct convolution, forward; returns y and a function (dy -> dx, dw, db)."""
    n, c, h, wd = x.shape
    k = w.shape[2]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    oh, ow = (h + 2 * p - k) // s + 1, (wd + 2 * p - k) // s + 1
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::s, ::s][:, :, :oh, :ow]
    y = np.einsum("ncijab,ocab->noij", win, w) + (0 if b is None else b[None, :, None, None])

    def backward(dy):
        dw = np.einsum("ncijab,noij->ocab", win, dy)
        dxp = np.zeros_like(xp)
        for a in range(k):
            for bb in range(k):
                dxp[:, :, a:a + s * oh:s, bb:bb + s * ow:s] += np.einsum("noij,oc->ncij", dy, w[:, :, a, bb])
        return dxp[:, :, p:p + h, p:p + wd], dw, dy.sum(axis=(0, 2, 3))
    return y, backward


@pytest.mark.parametrize("n,c,h,w,k,ks,s,p,bias", CONV_CASES[:4])
def test_conv2d_vs_numpy(queue, rng, record_error, n, c, h, w, k, ks, s, p, bias):
    layer = nn.Conv2d(c, k, ks, stride=s, padding=p, bias=bias)
    x = rand(rng, n, c, h, w)
    wt = layer.weight.to_host().astype(np.float64)
    bt = layer.bias.to_host().astype(np.float64) if bias else None
    ry, back = np_conv2d(x, wt, bt, s, p)
    dy = rand(rng, *ry.shape)
    rdx, rdw, rdb = back(dy.astype(np.float64))
    ref = (ry, rdx, {"weight": rdw, **({"bias": rdb} if bias else {})})
    compare(record_error, run_netcl(queue, layer, x, dy), ref)


def test_linear_vs_numpy(queue, rng, record_error):
    layer = nn.Linear(19, 6)
    x, dy = rand(rng, 5, 19), rand(rng, 5, 6)
    w, b = layer.weight.to_host().astype(np.float64), layer.bias.to_host().astype(np.float64)
    ref = (x @ w + b, dy @ w.T, {"weight": x.T.astype(np.float64) @ dy, "bias": dy.sum(0)})
    compare(record_error, run_netcl(queue, layer, x, dy), ref)


def test_batchnorm2d_vs_numpy(queue, rng, record_error):
    n, c, h, w = 3, 5, 4, 3
    layer = nn.BatchNorm2d(c)
    gamma, beta = rng.uniform(0.5, 1.5, c), rng.standard_normal(c)
    layer.weight.set_(gamma)
    layer.bias.set_(beta)
    x, dy = rand(rng, n, c, h, w).astype(np.float64), rand(rng, n, c, h, w).astype(np.float64)
    g4, b4 = gamma[None, :, None, None], beta[None, :, None, None]
    mu, var = x.mean((0, 2, 3), keepdims=True), x.var((0, 2, 3), keepdims=True)
    xhat = (x - mu) / np.sqrt(var + 1e-5)
    dxhat = dy * g4
    m = n * h * w
    dx = (m * dxhat - dxhat.sum((0, 2, 3), keepdims=True) - xhat * (dxhat * xhat).sum((0, 2, 3), keepdims=True)) \
        / (m * np.sqrt(var + 1e-5))
    ref = (xhat * g4 + b4, dx, {"weight": (dy * xhat).sum((0, 2, 3)), "bias": dy.sum((0, 2, 3))})
    compare(record_error, run_netcl(queue, layer, x.astype(np.float32), dy.astype(np.float32)), ref)
    sd = layer.state_dict()
    assert_close(sd["running_mean"], 0.1 * mu.ravel(), what="running_mean")
    assert_close(sd["running_var"], 0.9 + 0.1 * var.ravel() * m / (m - 1), what="running_var")


@pytest.mark.parametrize("kind", ["MaxPool2d", "AvgPool2d"])
def test_pool_vs_numpy(queue, rng, record_error, kind):
    n, c, h, w, k, s, p = 2, 3, 7, 8, 3, 2, 1
    x, layer = rand(rng, n, c, h, w), getattr(nn, kind)(k, stride=s, padding=p)
    pad = -np.inf if kind == "MaxPool2d" else 0.0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)), constant_values=pad)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    dy = rand(rng, n, c, oh, ow)
    y, dxp = np.zeros((n, c, oh, ow)), np.zeros_like(xp)
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * s:i * s + k, j * s:j * s + k].reshape(n, c, k * k)
            if kind == "MaxPool2d":
                a = win.argmax(-1)
                y[:, :, i, j] = win.max(-1)
                onehot = (np.arange(k * k) == a[..., None]) * dy[:, :, i, j, None]
                dxp[:, :, i * s:i * s + k, j * s:j * s + k] += onehot.reshape(n, c, k, k)
            else:
                y[:, :, i, j] = win.sum(-1) / (k * k)
                dxp[:, :, i * s:i * s + k, j * s:j * s + k] += dy[:, :, i, j, None, None] / (k * k)
    compare(record_error, run_netcl(queue, layer, x, dy), (y, dxp[:, :, p:p + h, p:p + w], {}))


def test_activations_and_softmax_vs_numpy(queue, rng, record_error):
    x, dy = rand(rng, 3, 4, 5) * 3, rand(rng, 3, 4, 5)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    sig, th = 1 / (1 + np.exp(-x64)), np.tanh(x64)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    sm = e / e.sum(1, keepdims=True)
    refs = {nn.ReLU(): (np.maximum(x64, 0), dy64 * (x64 > 0)),
            nn.LeakyReLU(0.1): (np.where(x64 > 0, x64, 0.1 * x64), np.where(x64 > 0, dy64, 0.1 * dy64)),
            nn.Sigmoid(): (sig, dy64 * sig * (1 - sig)), nn.Tanh(): (th, dy64 * (1 - th ** 2)),
            nn.Softmax(1): (sm, sm * (dy64 - (dy64 * sm).sum(1, keepdims=True)))}
    for layer, (y, dx) in refs.items():
        compare(record_error, run_netcl(queue, layer, x, dy), (y, dx, {}))
