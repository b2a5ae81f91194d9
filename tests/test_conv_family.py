"""The convolution family: grouped, depthwise and dilated Conv2d and ConvTranspose2d against
float64 PyTorch (forward, dx, dW, db), their errors, .netcl round trips, ONNX export through
onnxruntime, the fused inference path, and a few training steps."""
import numpy as np
import pytest
from conftest import assert_close, use_cpu_class
from test_layers import compare, rand, run_netcl, run_torch

import netcl
from netcl import Tensor, nn, ops, optim, tuning
from netcl.io import export_onnx, load, save
from netcl.nn import conv as conv_module
from netcl.nn import conv_route


def _same_weights(torch, layer, ref):
    ref.load_state_dict({name: torch.tensor(a) for name, a in layer.state_dict().items()})
    return ref


CONV_CASES = [  # N, C, H, W, K, k, stride, padding, dilation, groups, bias
    (2, 4, 7, 9, 6, 3, 1, 1, 1, 2, True),      # groups=2
    (1, 6, 9, 8, 9, 3, 2, 1, 1, 3, False),     # groups=3, stride 2, batch 1
    (2, 5, 9, 7, 5, 3, 1, 1, 1, 5, True),      # depthwise
    (3, 3, 8, 9, 6, 3, 2, 1, 1, 3, True),      # depthwise, channel multiplier 2, stride 2
    (1, 4, 11, 9, 4, 5, 1, 4, 2, 4, False),    # depthwise, dilated 5x5
    (2, 3, 9, 10, 5, 3, 1, 2, 2, 1, True),     # dilation 2 with padding
    (1, 4, 12, 11, 6, 3, 2, 3, 3, 2, True),    # grouped, dilated, strided
    (2, 6, 5, 7, 8, 1, 1, 0, 1, 2, True),      # grouped 1x1
    (2, 3, 2, 3, 6, 3, 2, 2, 2, 3, True),      # depthwise, dilated taps wider than the image
    (1, 2, 10, 7, 6, 5, 3, 2, 1, 2, True),     # depthwise, multiplier 3, stride 3
    (3, 3, 8, 9, 6, 3, 1, 1, 1, 3, True),      # depthwise stride 1 on CPUs: dw_fwd_cpu's 8-wide rows, multiplier 2
    (2, 4, 6, 20, 4, 5, 1, 2, 1, 4, False),    # depthwise 5x5: a 16-wide vector and a partial one a row
    (1, 3, 5, 4, 3, 3, 1, 0, 1, 3, True),      # depthwise, no padding: rows of 2 in a 4-wide vector
    (2, 16, 16, 16, 16, 3, 1, 1, 1, 16, True),  # depthwise as in mobilenetv2_tiny: whole 16-wide rows
    (2, 16, 16, 16, 16, 3, 2, 1, 1, 16, True),  # depthwise stride 2 as in mobilenetv2_tiny: rows of 8 (EVEN_LOAD)
    (1, 4, 9, 38, 8, 5, 2, 2, 1, 4, False),    # depthwise 5x5 stride 2, multiplier 2: a 16-wide vector and a partial one
    (2, 3, 7, 5, 3, 3, 2, 0, 1, 3, True),      # depthwise stride 2, no padding, odd planes: rows of 2 in a 4-wide vector
]


def assert_accumulates(queue, layer, x, dy):
    """A second backward pass adds the same parameter gradients again (gradients accumulate)."""
    first = run_netcl(queue, layer, x, dy)[2]
    second = run_netcl(queue, layer, x, dy)[2]
    for name in first:
        assert_close(second[name], 2 * first[name], what=name)


@pytest.mark.parametrize("n,c,h,w,k,ks,s,p,d,g,bias", CONV_CASES)
def test_conv2d_groups_dilation_vs_torch(queue, rng, torch, record_error, n, c, h, w, k, ks, s, p, d, g, bias):
    layer = nn.Conv2d(c, k, ks, stride=s, padding=p, dilation=d, groups=g, bias=bias)
    ref = _same_weights(torch, layer, torch.nn.Conv2d(c, k, ks, stride=s, padding=p, dilation=d, groups=g, bias=bias))
    x = rand(rng, n, c, h, w)
    dy = rand(rng, *layer.output_shape(x.shape))
    assert layer.output_shape(x.shape) == tuple(ref(torch.tensor(x)).shape)
    compare(record_error, run_netcl(queue, layer, x, dy), run_torch(torch, ref, x, dy))


CPU_PATH_CASES = [  # N, C, H, W, K, k, stride, padding, dilation, bias: each of the CPU training paths
    (2, 6, 11, 37, 5, 3, 1, 1, 1, True),   # "rows" kernels: vectors and a tail, odd rows, channel tails
    (1, 3, 20, 16, 4, 5, 1, 2, 1, False),  # direct 5x5
    (1, 10, 6, 20, 12, 3, 1, 1, 1, True),  # direct, blocks of 8 channels and a tail both ways
    (2, 5, 9, 20, 7, 3, 1, 0, 1, True),    # direct, no padding: dy padded by 2
    (1, 4, 7, 21, 3, 3, 1, 2, 1, True),    # direct, padding 2: dy not padded, dx narrower than dy
    (2, 4, 8, 18, 6, 3, 2, 1, 1, True),    # stride 2: GEMMs and a strided col2im
    (2, 3, 6, 33, 4, 1, 1, 0, 1, True),    # 1x1: GEMMs, the data gradient per image into dx
    (2, 3, 9, 26, 4, 3, 1, 2, 2, False),   # dilated: GEMMs and col2im in vectors
    (2, 36, 7, 9, 40, 3, 1, 1, 1, False),  # "channels": two blocks of 32 and tails both ways
    (2, 40, 6, 10, 36, 3, 2, 1, 1, True),  # "channels", stride 2: both phases of even and odd rows
    (1, 5, 9, 11, 33, 5, 2, 2, 1, True),   # "channels", 5x5 stride 2, odd sizes
    (2, 3, 5, 1, 4, 3, 2, 1, 1, True),     # "channels", stride 2 over one column: an empty phase
    (2, 6, 17, 17, 8, 3, 2, 1, 1, True),   # "channels", stride 2, 9 columns: im2col's 8-wide step and a tail
    (1, 4, 34, 33, 5, 3, 2, 1, 1, False),  # "channels", stride 2, 17 columns: its 16-wide step and a tail
    (2, 4, 12, 12, 6, 3, 1, 1, 1, True),   # "channels", stride 1 on 12 columns: 8-wide and a tail
]


@pytest.mark.parametrize("cls", ["native", "gpu"])
@pytest.mark.parametrize("n,c,h,w,k,ks,s,p,d,bias", CPU_PATH_CASES)
def test_conv2d_cpu_paths_vs_torch(queue, rng, torch, record_error, monkeypatch, cls, n, c, h, w, k, ks, s, p, d,
                                   bias):
    """Shapes that reach each of the CPU training paths (convtrain_cpu.cl; conv_route), on
    both device classes, and gradients accumulated over two backward passes."""
    from netcl import ops

    if cls == "gpu":
        monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    test_conv2d_groups_dilation_vs_torch(queue, rng, torch, record_error, n, c, h, w, k, ks, s, p, d, 1, bias)
    layer = nn.Conv2d(c, k, ks, stride=s, padding=p, dilation=d, bias=bias)
    x = rand(rng, n, c, h, w)
    dy = rand(rng, *layer.output_shape(x.shape))
    assert_accumulates(queue, layer, x, dy)


@pytest.mark.parametrize("n,c,h,w,k,ks,s,p,d,bias", [CPU_PATH_CASES[i] for i in (0, 2, 8, 9, 14)])
def test_conv2d_other_cpu_class_vs_torch(queue, rng, torch, record_error, monkeypatch, n, c, h, w, k, ks, s, p, d,
                                         bias):
    """The direct kernels' register blocks of the other CPU class (the tuning table: AVX-512's on an
    AVX2 device, AVX2's on an AVX-512 one; corr_cpu, wgrad_cpu, corrc_cpu, corrt_cpu), so that both
    are checked on every machine."""
    use_cpu_class(queue, monkeypatch, "other")
    test_conv2d_cpu_paths_vs_torch(queue, rng, torch, record_error, monkeypatch, "native", n, c, h, w, k, ks, s, p, d,
                                   bias)


NARROW_WGRAD_CASES = [  # N, C, H, W, K, k, padding, bias: "channels" stride 1, <= 27 weights an output channel
    (8, 1, 8, 8, 16, 3, 1, True),    # the digits CNN's first conv: rows of one 8-wide vector
    (2, 3, 8, 8, 5, 3, 1, True),     # 27 weights: one output channel a work-item
    (3, 1, 7, 4, 4, 5, 2, False),    # 5x5, rows of 4, an odd number of them: one row a vector
    (1, 2, 9, 10, 7, 3, 0, True),    # no padding: 8 columns; an odd channel block
    (2, 1, 6, 2, 3, 3, 2, True),     # padding 2: outputs wider than the input (4)
    (3, 2, 40, 4, 6, 3, 1, False),   # rows of 4 two a vector; 40 rows: the accumulators join the totals
    (2, 3, 4, 4, 5, 3, 1, True),     # rows of 4 two a vector, 27 weights
    (2, 1, 7, 8, 4, 3, 1, True),     # rows of 8 but an odd number of them: one row a vector
    (1, 1, 140, 8, 3, 3, 1, False),  # rows of 8 two a vector, 140 of them: runs of 64 rows, a short last one
    (2, 1, 9, 14, 4, 3, 2, True),    # 14 columns, padding 2: outputs of 16, one vector a row
]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("n,c,h,w,k,ks,p,bias", NARROW_WGRAD_CASES)
def test_conv2d_narrow_wgrad_vs_torch(queue, rng, torch, record_error, monkeypatch, split, n, c, h, w, k, ks, p, bias):
    """wgrad_narrow_cpu (dW and db of a first layer on narrow planes in one launch, no im2col)
    against float64 PyTorch, in one chunk and split over images (partial sums, sum_chunks_cpu),
    gradients accumulated over two backward passes."""
    if split:
        cut = tuning.values("conv_cutoffs", ops.config_class(queue))
        monkeypatch.setitem(cut, "narrow_split", 0)
        monkeypatch.setitem(cut, "narrow_items", 64)
    layer = nn.Conv2d(c, k, ks, padding=p, bias=bias)
    calls = []
    real = nn.Conv2d._wgrad_narrow
    monkeypatch.setattr(nn.Conv2d, "_wgrad_narrow", lambda self, *a: calls.append(a) or real(self, *a))
    test_conv2d_groups_dilation_vs_torch(queue, rng, torch, record_error, n, c, h, w, k, ks, 1, p, 1, 1, bias)
    assert len(calls) == ops.is_cpu(queue)
    x = rand(rng, n, c, h, w)
    # rows with a scalar tail (12, 13 wide) stay with im2col and the GEMM (slower there: narrow_widths)
    for wide in (11, 15):
        calls.clear()
        other = nn.Conv2d(c, k, ks, padding=p)
        run_netcl(queue, other, rand(rng, 1, c, h, wide), rand(rng, *other.output_shape((1, c, h, wide))))
        widths = tuning.values("conv_cutoffs", ops.config_class(queue))["narrow_widths"]
        assert calls == [] or other.output_shape((1, c, h, wide))[3] in widths
    dy = rand(rng, *layer.output_shape(x.shape))
    assert_accumulates(queue, layer, x, dy)


OC16_WGRAD_CASES = [  # N, C, H, W, K, k, padding, bias: "channels" stride 1 past 27 weights, 16k outputs a plane
    (8, 16, 4, 4, 32, 3, 1, True),    # the digits CNN's conv2: whole 16 x 16 blocks, stored as rows
    (3, 5, 4, 8, 20, 3, 1, True),     # 45 weights (a block of 13) and 20 output channels (one of 4)
    (2, 4, 4, 8, 17, 3, 1, False),    # rows of 8, 36 weights; 17 output channels
    (2, 2, 8, 8, 16, 5, 2, True),     # 5x5, padding 2, 50 weights
    (2, 4, 6, 10, 16, 3, 0, True),    # no padding: 4 x 8 outputs from 10-wide input rows
]


@pytest.mark.parametrize("n,c,h,w,k,ks,p,bias", OC16_WGRAD_CASES)
def test_conv2d_oc16_wgrad_vs_torch(queue, rng, torch, record_error, monkeypatch, n, c, h, w, k, ks, p, bias):
    """wgrad_oc16_cpu (dW and db in one launch, output channels in the lanes, no im2col) against
    float64 PyTorch on AVX-512 class devices, gradients accumulated over two backward passes;
    planes that are not 16k outputs keep im2col and the GEMM."""
    calls = []
    real = nn.Conv2d._wgrad_oc16
    monkeypatch.setattr(nn.Conv2d, "_wgrad_oc16", lambda self, *a: calls.append(a) or real(self, *a))
    test_conv2d_groups_dilation_vs_torch(queue, rng, torch, record_error, n, c, h, w, k, ks, 1, p, 1, 1, bias)
    assert len(calls) == (ops.config_class(queue) == "cpu16")
    layer = nn.Conv2d(c, k, ks, padding=p, bias=bias)
    x = rand(rng, n, c, h, w)
    dy = rand(rng, *layer.output_shape(x.shape))
    assert_accumulates(queue, layer, x, dy)
    calls.clear()
    other = nn.Conv2d(c, k, ks, padding=p)  # 12 outputs a plane
    run_netcl(queue, other, rand(rng, 1, c, 3 + ks - 1 - 2 * p, 4 + ks - 1 - 2 * p), rand(rng, 1, k, 3, 4))
    assert calls == []


STRIDE2_PLANE_CASES = [  # N, C, H, W, K, k, padding, bias: stride 2, 16 output positions per vector
    (2, 5, 32, 32, 7, 1, 0, True),     # 1x1 (pw2_*), rows of 16, output channels past a block of 8
    (1, 4, 16, 64, 9, 1, 0, False),    # 1x1, two vectors a row
    (3, 20, 16, 16, 9, 1, 0, True),    # 1x1, rows of 8: two a vector; 20 channels (blocks of 8, a tail)
    (2, 6, 32, 64, 5, 3, 1, True),     # 3x3 data gradient (corrt2_cpu): two vectors a row, a channel tail
    (2, 9, 16, 16, 12, 3, 1, False),   # 3x3, rows of 8: the last vector's second row has none below
    (1, 3, 16, 32, 4, 3, 1, True),     # 3x3, one vector a row, fewer channels than a block
    (1, 5, 32, 32, 4, 3, 1, False),    # 3x3, two rows a work-item (corrt2p_cpu), an odd channel count
    (1, 4, 18, 32, 6, 3, 1, True),     # 3x3, rows of 16 but 9 of them: one row a work-item (corrt2_cpu)
]

# rows of 8 but an odd number of them (or one): two rows a vector do not tile the plane, the
# general kernels take these (the 8-wide paths once read and wrote past the planes here)
STRIDE2_ODD_ROWS = [(2, 8, 6, 16, 8, 1, 0, True), (3, 5, 10, 16, 6, 3, 1, False), (2, 4, 2, 16, 8, 1, 0, False)]


@pytest.mark.parametrize("cls", ["native", "other"])
@pytest.mark.parametrize("n,c,h,w,k,ks,p,bias", STRIDE2_PLANE_CASES + STRIDE2_ODD_ROWS)
def test_conv2d_stride2_planes_vs_torch(queue, rng, torch, record_error, monkeypatch, n, c, h, w, k, ks, p, bias, cls):
    """The CPU kernels with 16 output positions of a plane in a vector (conv_route's stride-2 routes):
    the 1x1 stride-2 forward and gradients, the 3x3 stride-2 data gradient by phases; gradients
    accumulate, and a 1x1's data gradient is added into a tensor (a Residual's shortcut). Rows of
    8 in odd number fall back to the general kernels. With both CPU classes' blocks (the tuning table:
    AVX2's PW_RM, PW_WC and CT2_RM are half AVX-512's)."""
    use_cpu_class(queue, monkeypatch, cls)
    layer = nn.Conv2d(c, k, ks, stride=2, padding=p, bias=bias)
    if ops.is_cpu(queue):
        takes = (n, c, h, w, k, ks, p, bias) not in STRIDE2_ODD_ROWS
        assert (layer.route(queue, (n, c, h, w)).stride2 != ()) == takes
    test_conv2d_groups_dilation_vs_torch(queue, rng, torch, record_error, n, c, h, w, k, ks, 2, p, 1, 1, bias)
    x, dy = rand(rng, n, c, h, w), rand(rng, *layer.output_shape((n, c, h, w)))
    first = run_netcl(queue, layer, x, dy)
    second = run_netcl(queue, layer, x, dy)[2]
    for name in first[2]:
        assert_close(second[name], 2 * first[2][name], what=name)
    base = rand(rng, n, c, h, w)
    layer(Tensor.from_host(queue, x))
    if ops.is_cpu(queue) and ks == 3:  # x read as it is (no padded copy) where the phases kernels run
        assert (layer._saved.route.forward == "phases") == takes
    acc = Tensor.from_host(queue, base)
    layer.backward_into(Tensor.from_host(queue, dy), acc)
    assert_close(acc.to_host(), base + first[1], what="backward_into")


@pytest.mark.parametrize("cls", ["native", "other"])
@pytest.mark.parametrize("n,c,k,bias", [(2, 7, 20, True), (3, 4, 16, False), (3, 11, 40, True)])
def test_stride2_weight_gradient_kernels_by_class(queue, rng, monkeypatch, n, c, k, bias, cls):
    """A 3x3 stride-2 convolution's weight and bias gradients after a "phases" forward: AVX2's blocks
    (WG2_OL) take them with output channels in the lanes (dy_t8_cpu, wgrad2o_cpu), AVX-512's with
    positions in the lanes (wgrad2_cpu, the bias by channel_sum); both against float64 numpy, an odd
    input channel count (the last pair's second repeats the first), output channels past a block
    of 16 and (3, 11, 40; AVX2's chunking) chunks of two images, the last one short, included."""
    if not ops.is_cpu(queue):
        pytest.skip("the CPU kernels")
    use_cpu_class(queue, monkeypatch, cls)
    launched, launch = [], ops.launch

    def spy(q, family, name, *args, options=()):
        launched.append(name)
        return launch(q, family, name, *args, options=options)
    monkeypatch.setattr(ops, "launch", spy)
    layer = nn.Conv2d(c, k, 3, stride=2, padding=1, bias=bias).to(queue).train()
    x, dy = rand(rng, n, c, 32, 32), rand(rng, n, k, 16, 16)
    layer(Tensor.from_host(queue, x))
    assert layer._saved.route.forward == "phases"
    launched.clear()
    layer.backward(Tensor.from_host(queue, dy))
    lanes = conv_module._blocks(queue)["WG2_OL"]
    assert lanes == (ops.config_class(queue) == "cpu")
    assert ("wgrad2o_cpu" in launched, "dy_t8_cpu" in launched, "wgrad2_cpu" in launched) == (lanes, lanes, not lanes)
    assert ("channel_sum" in launched) == (bias and not lanes)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((k, c, 3, 3))
    for j in range(3):
        for l in range(3):
            want[:, :, j, l] = np.einsum("nohw,nchw->oc", dy.astype(np.float64), xp[:, :, j:j + 32:2, l:l + 32:2])
    assert_close(layer.weight.grad.to_host(), want, what="dW")
    if bias:
        assert_close(layer.bias.grad.to_host(), dy.astype(np.float64).sum(axis=(0, 2, 3)), what="db")


winot_wgrad = conv_module._winot_wgrad

WINOT_CASES = [  # N, C, H, W, K, bias: 3x3 stride-1 padding-1 convolutions conv_winot.cl trains
    (2, 8, 8, 32, 12, True),   # "rows" mode, a tile row per vector; dx: 12 -> 8 channels (blocks of 8)
    (1, 16, 4, 16, 20, False),  # 16 wide: two tile rows per vector; 20 channels (a block of 16 and a tail)
    (2, 9, 8, 8, 16, True),    # "channels" mode, 8 wide: four tile rows per vector; dW by the direct
    (1, 8, 2, 64, 8, False),   # two vectors per tile row
    (19, 8, 8, 8, 12, True),   # "channels" mode: winot_wgrad's 19 tile vectors in 4 chunks of 5, the last one short
    (3, 12, 16, 16, 8, False),  # "rows" mode, 16 wide
    (2, 8, 8, 16, 16, True),   # K % 6 = 4: the 8-wide weight gradient's 6 x 2 blocks and a last block of 4
]


@pytest.fixture(params=[16, 8])
def winot_lanes(request, queue, monkeypatch):
    """conv_winot.cl's variants by the device's float vector width, on any CPU: 16 (AVX-512: KV 16
    or 8, winot_wgrad's float16 accumulators, WGV 16) and 8 (AVX2: KV 4, WGV 8). Their launches
    are checked to carry those defines."""
    monkeypatch.setattr(ops, "float_lanes", lambda q: request.param)
    launched, launch = [], ops.launch

    def spy(q, family, name, *args, options=()):
        if family == "conv_winot":
            launched.append((name, options))
        return launch(q, family, name, *args, options=options)
    monkeypatch.setattr(ops, "launch", spy)
    yield request.param
    for name, options in launched:
        kv = int(next(o for o in options if o.startswith("-DKV="))[5:])
        assert (kv == 4) == (request.param == 8), (name, options)
        if name == "winot_wgrad":
            assert f"-DWGV={request.param}" in options


def test_float_lanes_follow_the_device_or_the_environment(queue, monkeypatch):
    """The vector width the CPU kernels assume: what the device can do (runtime.device_lanes; PoCL's
    preferred width as it is), or NETCL_FLOAT_LANES (4, 8 or 16; anything else a ValueError saying
    what it takes)."""
    from netcl import runtime

    monkeypatch.delenv("NETCL_FLOAT_LANES", raising=False)
    assert ops.float_lanes(queue) == runtime.float_lanes(queue.device) == runtime.device_lanes(queue.device)
    if "pocl" in queue.device.platform.name.lower():
        assert runtime.device_lanes(queue.device) == queue.device.preferred_vector_width_float
    for text in ("4", "8", "16"):
        monkeypatch.setenv("NETCL_FLOAT_LANES", text)
        assert ops.float_lanes(queue) == runtime.float_lanes(queue.device) == int(text)
    for text in ("7", "avx2", "32"):
        monkeypatch.setenv("NETCL_FLOAT_LANES", text)
        with pytest.raises(ValueError, match="NETCL_FLOAT_LANES must be one of 4, 8, 16"):
            ops.float_lanes(queue)


def test_device_lanes_by_what_the_device_can_do(tmp_path, monkeypatch):
    """The preferred width where netcl has kernels of it (PoCL: 16 on AVX-512, 8 on AVX2), else the
    native one (Intel's CPU runtime: preferred 1, native 16 on AVX-512), else the host CPU's flags."""
    import pyopencl as cl

    from netcl import runtime

    class Dev:
        def __init__(self, preferred, native, type=cl.device_type.CPU):
            self.preferred_vector_width_float, self.native_vector_width_float, self.type = preferred, native, type

    assert [runtime.device_lanes(Dev(p, n)) for p, n in [(16, 16), (8, 8), (8, 16), (4, 4)]] == [16, 8, 8, 4]
    assert [runtime.device_lanes(Dev(1, n)) for n in (16, 8)] == [16, 8]
    info = tmp_path / "cpuinfo"
    for flags, lanes in [("fpu sse2 avx avx2 avx512f avx512bw", 16), ("fpu sse2 avx avx2 fma", 8), ("fpu sse2", 4)]:
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
        assert runtime.host_lanes(str(info)) == lanes
    assert runtime.host_lanes("/no/such/cpuinfo") == 4
    monkeypatch.setattr(runtime, "host_lanes", lambda: 16)
    assert runtime.device_lanes(Dev(1, 1)) == 16
    assert runtime.device_lanes(Dev(1, 1, cl.device_type.GPU)) == 4


def test_winot_blocks_follow_the_vector_width():
    """conv_winot.cl's output channels per block by the device's float vector width (16 accumulators
    of 16 lanes on AVX-512, 4 float16 = 8 ymm on AVX2), and where it runs unforced: training from 8
    lanes on, the fused inference path from 16; NETCL_CPU_WINOT's choice over either."""
    from netcl.convspec import WINOT_TRAIN_LANES, winot_enabled, winot_kv, winot_plain
    assert (winot_kv(16, 16), winot_kv(8, 16), winot_kv(64, 8), winot_kv(16, 4)) == (16, 8, 4, 4)
    assert winot_enabled(None, 8, WINOT_TRAIN_LANES) and not winot_enabled(None, 4, WINOT_TRAIN_LANES)
    assert winot_enabled(None, 16) and not winot_enabled(None, 8)
    assert winot_enabled(True, 4, WINOT_TRAIN_LANES) and not winot_enabled(False, 16, WINOT_TRAIN_LANES)
    d8, o8 = winot_plain(16, 20, 8, 32, False, 8)
    assert (d8["KV"], d8["KB"]) == (4, 5) and "-DKV=4" in o8 and winot_plain(16, 20, 8, 32)[0]["KB"] == 2


@pytest.mark.parametrize("n,c,h,w,k", [(3, 8, 8, 32, 12), (2, 8, 2, 64, 8), (2, 16, 4, 16, 20), (3, 12, 8, 8, 16)])
def test_winot_prefetch_changes_no_result(queue, rng, monkeypatch, winot_lanes, n, c, h, w, k):
    """The training path builds conv_winot with WINOT_PREFETCH (each work-item prefetching the next
    one's input rows: a tile row a vector, two vectors a row, T 2 and T 4, the next image's first
    from an image's last; winot_wgrad's transforms a plane ahead); its outputs, batch-statistics
    parts, data gradients added in place and weight gradients (ROWS 4 and 1) are those of the
    kernels without the prefetches, bit for bit."""
    if not ops.is_cpu(queue):
        pytest.skip("conv_winot.cl trains on CPUs")
    from netcl.convspec import winot_plain

    defines, options = winot_plain(c, k, h, w, False, winot_lanes)
    assert defines["WINOT_PREFETCH"] == 1 and "-DWINOT_PREFETCH=1" in options
    def without(layout):
        return layout[0], tuple(o.replace("-DWINOT_PREFETCH=1", "-DWINOT_PREFETCH=0") for o in layout[1])
    added = winot_plain(k, c, h, w, True, winot_lanes)
    plain, added_plain = without((defines, options)), without(added)
    x = np.zeros((n, c, h + 2, w + 2), np.float32)
    x[:, :, 1:-1, 1:-1] = rand(rng, n, c, h, w)
    dy = np.zeros((n, k, h + 2, w + 2), np.float32)
    dy[:, :, 1:-1, 1:-1] = rand(rng, n, k, h, w)
    wt, bias, base = rand(rng, k, c, 3, 3), rand(rng, k), rand(rng, n, c, h, w)
    results = []
    for layouts in (((defines, options), added), (plain, added_plain)):
        out, dx = Tensor.empty(queue, (n, k, h, w)), Tensor.from_host(queue, base)
        stats = conv_module._winot(queue, Tensor.from_host(queue, x), Tensor.from_host(queue, wt), out, False,
                                   layouts[0], Tensor.from_host(queue, bias), stats=True)
        conv_module._winot(queue, Tensor.from_host(queue, dy), Tensor.from_host(queue, wt), dx, True, layouts[1],
                           Tensor.zeros(queue, (c,)), add=True)
        results.append((out.to_host(), stats[0].to_host(), dx.to_host()))
        for rows in (4, 1):
            monkeypatch.setattr(conv_route, "wgrad_rows", lambda tv16, nt, t, rows=rows: rows)
            gw = Tensor.empty(queue, (k, c, 3, 3))
            d = layouts[0][0]
            groups = conv_route.winot_wgrad_groups(c, k, n * (h // 2 // d["T"]) * d["VPR"],
                                                   conv_module.device_class(queue))
            conv_module._winot_wgrad(queue, Tensor.from_host(queue, x), Tensor.from_host(queue, dy), gw, False,
                                     layouts[0], groups, border=1)
            results[-1] += (gw.to_host(),)
    for a, b in zip(*results):
        assert np.array_equal(a, b)
    assert not np.array_equal(results[0][2], base)  # the gradient was added


@pytest.mark.parametrize("rows", [4, 1])
@pytest.mark.parametrize("n,c,h,w,k,bias", WINOT_CASES)
def test_conv2d_winot_training_vs_torch(queue, rng, torch, record_error, monkeypatch, winot_lanes, n, c, h, w, k,
                                        bias, rows):
    """The CPU training path's Winograd (conv_winot.cl: the forward and the data gradient, the
    weights transformed on the device; the weight gradient's work-items of all 16 points or of one
    transformed row's 4, ROWS 4 or 1; each device width's variant) against float64 PyTorch, forced
    on any CPU (NETCL_CPU_WINOT=1); with NETCL_CPU_WINOT=0 the direct kernels take the same shapes."""
    monkeypatch.setenv("NETCL_CPU_WINOT", "1")
    monkeypatch.setattr(conv_route, "wgrad_rows", lambda tv16, nt, t: rows)
    groups, launches = conv_route.winot_wgrad_groups, []
    monkeypatch.setattr(conv_route, "winot_wgrad_groups", lambda *a: launches.append(groups(*a)) or launches[-1])
    layer = nn.Conv2d(c, k, 3, padding=1, bias=bias)
    if ops.is_cpu(queue):
        assert layer.route(queue, (n, c, h, w)).winot is not None
        assert layer.route(queue, (n, c, h, w)).winot_dx is not None
    wgrads = []
    monkeypatch.setattr(conv_module, "_winot_wgrad", lambda *a, **kw: wgrads.append(a) or winot_wgrad(*a, **kw))
    test_conv2d_groups_dilation_vs_torch(queue, rng, torch, record_error, n, c, h, w, k, 3, 1, 1, 1, 1, bias)
    # the weight gradient by winot_wgrad where both channel counts are multiples of 4 (its blocks)
    assert len(wgrads) == (ops.is_cpu(queue) and c % 4 == 0 and k % 4 == 0)
    assert all(g[0] == rows for g in launches) and (launches or not wgrads)
    x, dy = rand(rng, n, c, h, w), rand(rng, n, k, h, w)
    assert_accumulates(queue, layer, x, dy)
    monkeypatch.setenv("NETCL_CPU_WINOT", "0")
    assert layer.route(queue, (n, c, h, w)).winot is None


@pytest.mark.parametrize("rows", [4, 1])
def test_winot_wgrad_chunks_add_in_order(queue, rng, torch, record_error, monkeypatch, winot_lanes, rows):
    """winot_wgrad's work-items, of all 16 points (ROWS 4) or of one transformed row's 4 (ROWS 1),
    each take several chunks of tile vectors in turn (local memory for a few here: 19 tile vectors
    in 8 work-items of 2 chunks of 2, or 2 groups of 2 chunks of 5, the last ones short or empty),
    adding each chunk's sums onto their own: the weight gradient as float64 PyTorch's."""
    monkeypatch.setenv("NETCL_CPU_WINOT", "1")
    if ops.is_cpu(queue):
        t = tuning.values("winot_wgrad", ops.config_class(queue))
        monkeypatch.setitem(t, "share", 48 * 1024 / ops.local_mem(queue))
        monkeypatch.setitem(t, "items_per_cu", 0)  # min_items (8), whatever the cores
        monkeypatch.setattr(conv_route, "wgrad_rows", lambda tv16, nt, t: rows)
        expected = (4, 2, 2, 8) if rows == 4 else (1, 5, 2, 2)
        assert conv_route.winot_wgrad_groups(8, 12, 19, conv_module.device_class(queue)) == expected
    wgrads = []
    monkeypatch.setattr(conv_module, "_winot_wgrad", lambda *a, **kw: wgrads.append(a) or winot_wgrad(*a, **kw))
    test_conv2d_groups_dilation_vs_torch(queue, rng, torch, record_error, 19, 8, 8, 8, 12, 3, 1, 1, 1, 1, True)
    assert len(wgrads) == ops.is_cpu(queue)


def test_conv2d_winot_zero_bias_is_made_once_per_size(queue, rng, monkeypatch):
    """Without a bias, conv_winot gets zeros: out_channels of them forward, in_channels for the data
    gradient, each made once and reused by every later step."""
    monkeypatch.setenv("NETCL_CPU_WINOT", "1")
    layer = nn.Conv2d(8, 16, 3, padding=1, bias=False).to(queue).train()
    x = Tensor.from_host(queue, rand(rng, 2, 8, 8, 32))
    made = None
    for _ in range(3):
        y = layer(x)
        layer.backward(Tensor.from_host(queue, np.ones(y.shape, np.float32)))
        if made is None and ops.is_cpu(queue):
            made = dict(layer._zero_bias)
    if ops.is_cpu(queue):
        assert sorted(size for size, _ in made) == [8, 16]
        assert all(layer._zero_bias[key] is z for key, z in made.items()) and len(layer._zero_bias) == 2


TRANSPOSE_CASES = [  # N, C, H, W, K, k, stride, padding, output_padding, bias
    (2, 4, 5, 7, 3, 3, 2, 1, 1, True),   # stride 2, output_padding 1
    (1, 3, 4, 5, 5, 4, 2, 1, 0, True),   # the usual 2x upsampling, batch 1
    (2, 5, 3, 3, 2, 2, 2, 0, 0, False),  # non-overlapping
    (3, 2, 6, 5, 7, 3, 1, 1, 0, True),   # stride 1: a padded convolution's adjoint
    (1, 3, 4, 3, 2, 5, 3, 2, 2, True),   # stride 3, output_padding 2, odd sizes
    (2, 3, 5, 17, 4, 3, 1, 1, 0, True),  # rows of 17: the CPU col2im's vectors and tail
]


@pytest.mark.parametrize("n,c,h,w,k,ks,s,p,op,bias", TRANSPOSE_CASES)
def test_conv_transpose2d_vs_torch(queue, rng, torch, record_error, n, c, h, w, k, ks, s, p, op, bias):
    layer = nn.ConvTranspose2d(c, k, ks, stride=s, padding=p, output_padding=op, bias=bias)
    ref = _same_weights(torch, layer, torch.nn.ConvTranspose2d(c, k, ks, stride=s, padding=p, output_padding=op,
                                                               bias=bias))
    x = rand(rng, n, c, h, w)
    dy = rand(rng, *layer.output_shape(x.shape))
    assert layer.output_shape(x.shape) == tuple(ref(torch.tensor(x)).shape)
    compare(record_error, run_netcl(queue, layer, x, dy), run_torch(torch, ref, x, dy))


@pytest.fixture
def gpu_class(queue, monkeypatch):
    """The "gpu" device class on this device: im2col_gpu, col2im_gpu, gemm_tile, and sum_axis's
    two stages from 32 summands on (chunks of 24, so the conv bias gradients below have tails)."""
    from netcl import ops

    monkeypatch.setattr(ops, "_config_class", {queue.device.int_ptr: "gpu"})
    monkeypatch.setattr(ops, "_compute_units", {queue.device.int_ptr: 8})
    monkeypatch.setattr(ops, "_SUM_SPLIT", 32)
    monkeypatch.setattr(ops, "_SUM_CHUNK", 24)


GPU_CONV_CASES = [  # N, C, H, W, K, k, stride, padding, dilation, groups, bias
    (2, 3, 7, 9, 5, 3, 1, 1, 1, 1, True),      # padded, odd sizes
    (1, 5, 8, 8, 6, 3, 2, 1, 1, 1, True),      # strided, batch 1 (bias: one stage, 16 summands)
    (3, 4, 9, 7, 7, 5, 2, 2, 1, 1, False),     # 5x5, strided, padded
    (2, 3, 2, 3, 4, 3, 1, 2, 2, 1, True),      # dilated taps wider than the image
    (2, 3, 9, 10, 5, 3, 1, 2, 2, 1, True),     # dilated, padded
    (1, 4, 12, 11, 6, 3, 2, 3, 3, 2, True),    # grouped, dilated, strided
    (2, 6, 5, 7, 8, 1, 1, 0, 1, 2, True),      # grouped 1x1
    (2, 3, 10, 11, 8, 1, 2, 0, 1, 1, False),   # 1x1 stride 2: col2im leaves pixels without taps
    (2, 5, 9, 7, 5, 3, 1, 1, 1, 5, True),      # depthwise (conv.cl's dw_* kernels; CPUs run their _cpu variants)
    (3, 3, 8, 9, 6, 3, 2, 1, 1, 3, True),      # depthwise, channel multiplier 2, stride 2
]


@pytest.mark.parametrize("n,c,h,w,k,ks,s,p,d,g,bias", GPU_CONV_CASES)
def test_conv2d_gpu_class_vs_torch(queue, rng, torch, record_error, gpu_class, n, c, h, w, k, ks, s, p, d, g, bias):
    test_conv2d_groups_dilation_vs_torch(queue, rng, torch, record_error, n, c, h, w, k, ks, s, p, d, g, bias)


@pytest.mark.parametrize("n,c,h,w,k,ks,s,p,op,bias", [TRANSPOSE_CASES[0], TRANSPOSE_CASES[3], TRANSPOSE_CASES[4]])
def test_conv_transpose2d_gpu_class_vs_torch(queue, rng, torch, record_error, gpu_class, n, c, h, w, k, ks, s, p, op,
                                             bias):
    test_conv_transpose2d_vs_torch(queue, rng, torch, record_error, n, c, h, w, k, ks, s, p, op, bias)


@pytest.mark.parametrize("make", [lambda: nn.Conv2d(4, 8, 3, padding=1, groups=4),
                                  lambda: nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2),
                                  lambda: nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)])
def test_parameter_gradients_accumulate(queue, rng, make):
    layer = make()
    x = rand(rng, 2, 4, 6, 5)
    dy = rand(rng, *layer.output_shape(x.shape))
    assert_accumulates(queue, layer, x, dy)


def test_torch_init_bounds():
    """PyTorch's default init: U(+-1/sqrt(fan_in)), fan_in = in/groups*k*k (ConvTranspose2d: out*k*k)."""
    for layer, fan_in in ((nn.Conv2d(8, 16, 3, groups=8), 9), (nn.Conv2d(8, 4, 3, groups=2), 36),
                          (nn.ConvTranspose2d(2, 16, 3), 144)):
        w = layer.weight.to_host()
        assert np.abs(w).max() <= 1 / np.sqrt(fan_in) < 1.3 * np.abs(w).max()


def test_tensor_shapes():
    assert nn.Conv2d.tensor_shapes(8, 12, 3, groups=4) == {"weight": (12, 2, 3, 3), "bias": (12,)}
    assert nn.ConvTranspose2d.tensor_shapes(3, 5, 4, bias=False) == {"weight": (3, 5, 4, 4)}
    for layer in (nn.Conv2d(6, 4, 3, dilation=2, groups=2, bias=False), nn.ConvTranspose2d(3, 5, 2, 2)):
        held = {k: t.shape for k, t in layer.named_tensors()}
        assert type(layer).tensor_shapes(**layer.config()) == held


@pytest.mark.parametrize("make,match", [
    (lambda: nn.Conv2d(6, 4, 3, groups=4), r"in_channels \(6\) must be divisible by groups \(4\)"),
    (lambda: nn.Conv2d(4, 6, 3, groups=4), r"out_channels \(6\) must be divisible by groups \(4\)"),
    (lambda: nn.Conv2d(4, 4, 3, groups=0), "groups must be >= 1"),
    (lambda: nn.Conv2d(4, 4, 3, dilation=0), "dilation must be >= 1"),
    (lambda: nn.Conv2d(4, 4, 3, padding=-1), "padding must be between 0 and"),
    (lambda: nn.Conv2d.tensor_shapes(6, 4, 3, groups=4), "divisible by groups"),
    (lambda: nn.ConvTranspose2d(4, 4, 3, stride=2, output_padding=2), r"output_padding \(2\) must be smaller"),
    (lambda: nn.ConvTranspose2d(4, 4, 3, output_padding=-1), "output_padding must be between 0 and"),
    (lambda: nn.Conv2d(4, 4, 3, dilation=3).output_shape((1, 4, 6, 6)), "does not fit"),
    (lambda: nn.ConvTranspose2d(4, 4, 1, padding=1).output_shape((1, 4, 2, 2)), "no output"),
    (lambda: nn.ConvTranspose2d(4, 4, 3).output_shape((1, 3, 5, 5)), "expects 4 input channels"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_types():
    with pytest.raises(TypeError):
        nn.Conv2d(4, 4, 3, groups=2.0)
    with pytest.raises(TypeError):
        nn.ConvTranspose2d(4, 4, 3, output_padding="1")


# -- files ---------------------------------------------------------------------------------
def conv_family_model():
    # x: (N, 4, 9, 9) -> (N, 3, 10, 10): depthwise (multiplier 2), grouped dilated, transposed
    return nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1, groups=4), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 6, 3, stride=2, padding=2, dilation=2, groups=2, bias=False), nn.ReLU(),
        nn.ConvTranspose2d(6, 5, 3, stride=2, padding=1, output_padding=1), nn.Tanh(),
        nn.Conv2d(5, 3, 1))


def test_round_trip_is_bit_exact(queue, rng, tmp_path):
    model = conv_family_model()
    path = tmp_path / "m.netcl"
    save(model, path)
    loaded = load(str(path))
    assert [(type(a), a.config()) for a in loaded] == [(type(b), b.config()) for b in model]
    want, got = model.state_dict(), loaded.state_dict()
    assert list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)
    x = rand(rng, 2, 4, 9, 9)
    model.train(False)._fused, loaded.train(False)._fused = None, None  # the layers, not the pending planner
    assert np.array_equal(model(Tensor.from_host(queue, x)).to_host(), loaded(Tensor.from_host(queue, x)).to_host())


def test_file_with_indivisible_groups_is_refused(tmp_path):
    import hashlib

    from netcl import FormatError

    path = tmp_path / "m.netcl"
    save(nn.Sequential(nn.Conv2d(4, 4, 3, groups=2)), path)
    body = path.read_bytes()[:-32]  # the file ends in the SHA-256 of the rest
    bad = body.replace(b'"groups": 2', b'"groups": 3')  # the same length: the header size still holds
    assert bad != body
    (tmp_path / "bad.netcl").write_bytes(bad + hashlib.sha256(bad).digest())
    with pytest.raises((FormatError, ValueError), match="divisible by groups"):
        load(str(tmp_path / "bad.netcl"))


# -- ONNX ----------------------------------------------------------------------------------
EXPORT_CASES = {
    "grouped": (lambda: nn.Sequential(nn.Conv2d(4, 6, 3, padding=1, groups=2), nn.ReLU()), (4, 7, 9)),
    "depthwise": (lambda: nn.Sequential(nn.Conv2d(5, 10, 3, stride=2, padding=1, groups=5)), (5, 9, 8)),
    "dilated": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=2, dilation=2, bias=False)), (3, 9, 10)),
    "transposed": (lambda: nn.Sequential(nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)),
                   (4, 5, 7)),
    "transposed-plain": (lambda: nn.Sequential(nn.ConvTranspose2d(3, 2, 2, stride=2, bias=False)), (3, 4, 5)),
    "family": (conv_family_model, (4, 9, 9)),
}


@pytest.mark.parametrize("name", sorted(EXPORT_CASES))
def test_export_matches_onnxruntime(queue, rng, tmp_path, name):
    pytest.importorskip("onnxruntime")
    from netcl.apps.common import ort_session

    build, shape = EXPORT_CASES[name]
    model = build().eval()
    model._fused = None  # netcl's own layers are the reference here
    path = tmp_path / "m.onnx"
    export_onnx(model, (2,) + shape, path, dynamic_batch=True)
    session = ort_session(path, "cpu")
    for n in (1, 3):
        x = rand(rng, n, *shape)
        got = session.run(None, {"input": x})[0]
        want = model(Tensor.from_host(queue, x)).to_host()
        assert got.shape == want.shape
        assert_close(got, want, rtol=0, atol=1e-5, what=f"{name} batch {n}")


def test_export_passes_onnx_checker(tmp_path):
    onnx = pytest.importorskip("onnx")
    for name, (build, shape) in EXPORT_CASES.items():
        for dyn in (False, True):
            path = tmp_path / f"{name}{dyn}.onnx"
            export_onnx(build().eval(), (2,) + shape, path, dynamic_batch=dyn)
            m = onnx.load(str(path))
            onnx.checker.check_model(m, full_check=True)
            assert m.SerializeToString() == path.read_bytes()


def _attributes(path):
    from netcl.io.onnx_export import onnx_pb2 as P

    with open(path, "rb") as f:
        graph = P.ModelProto.FromString(f.read()).graph
    return {n.op_type: {a.name: (list(a.ints) if a.ints else a.i) for a in n.attribute} for n in graph.node}


def test_export_attributes(tmp_path):
    """dilations/group and output_padding appear only when they differ from ONNX's defaults."""
    cases = [(nn.Conv2d(4, 4, 3, padding=1), (1, 4, 5, 5), "Conv", {"kernel_shape", "pads", "strides"}),
             (nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=4), (1, 4, 5, 5), "Conv",
              {"kernel_shape", "pads", "strides", "dilations", "group"}),
             (nn.ConvTranspose2d(4, 2, 3, stride=2), (1, 4, 3, 3), "ConvTranspose",
              {"kernel_shape", "pads", "strides"}),
             (nn.ConvTranspose2d(4, 2, 3, stride=2, output_padding=1), (1, 4, 3, 3), "ConvTranspose",
              {"kernel_shape", "pads", "strides", "output_padding"})]
    for i, (layer, shape, op, names) in enumerate(cases):
        export_onnx(nn.Sequential(layer).eval(), shape, tmp_path / f"{i}.onnx")
        attrs = _attributes(tmp_path / f"{i}.onnx")[op]
        assert set(attrs) == names, op
    assert attrs["output_padding"] == [1, 1] and attrs["strides"] == [2, 2]
    assert _attributes(tmp_path / "1.onnx")["Conv"]["group"] == 4


# -- the fused inference path ----------------------------------------------------------------
def _eval_fused_and_unfused(queue, model, x):
    model.eval()
    y = model(Tensor.from_host(queue, x)).to_host()
    plan, model._fused = model._fused, None
    try:
        ref = model(Tensor.from_host(queue, x)).to_host()
    finally:
        model._fused = plan
    return y, ref


@pytest.mark.parametrize("batch", [1, 3])
def test_fused_plan_runs_transposed_conv(queue, rng, batch):
    """groups=1, dilation=1 convolutions fuse; ConvTranspose2d runs unfused inside the plan."""
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                          nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
                          nn.Conv2d(4, 2, 3, padding=1))
    y, ref = _eval_fused_and_unfused(queue, model, rand(rng, batch, 3, 7, 5))
    assert y.shape == ref.shape == (batch, 2, 14, 10)
    np.testing.assert_allclose(y, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch", [1, 3])
def test_fused_plan_grouped_and_dilated(queue, rng, batch):
    y, ref = _eval_fused_and_unfused(queue, conv_family_model(), rand(rng, batch, 4, 9, 9))
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, atol=1e-5, rtol=1e-5)


# -- training --------------------------------------------------------------------------------
def test_sgd_steps_decrease_the_loss(queue, rng, torch):
    """An encoder-decoder with a depthwise and a transposed conv: a few SGD steps lower the loss,
    along the same trajectory as the same model in float64 PyTorch."""
    netcl.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(2, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), nn.ReLU(),
                          nn.ConvTranspose2d(8, 2, 3, stride=2, padding=1, output_padding=1))
    ref = torch.nn.Sequential(torch.nn.Conv2d(2, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), torch.nn.ReLU(),
                              torch.nn.ConvTranspose2d(8, 2, 3, stride=2, padding=1, output_padding=1)).double()
    ref.load_state_dict({k: torch.tensor(a, dtype=torch.float64) for k, a in model.state_dict().items()})
    opt, ref_opt = optim.SGD(model.parameters(), lr=0.5), torch.optim.SGD(ref.parameters(), lr=0.5)
    loss_fn = nn.MSELoss()
    x = rand(rng, 8, 2, 8, 8)
    target = x.reshape(8, 2, 4, 2, 4, 2).mean(axis=(3, 5)).repeat(2, 2).repeat(2, 3)  # 2x2 block averages
    losses, ref_losses = [], []
    for _ in range(10):
        losses.append(loss_fn(model(Tensor.from_host(queue, x)), target))
        model.backward(loss_fn.backward())
        opt.step()
        opt.zero_grad()
        ref_loss = torch.nn.functional.mse_loss(ref(torch.tensor(x, dtype=torch.float64)),
                                                torch.tensor(target, dtype=torch.float64))
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        ref_losses.append(ref_loss.item())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < 0.95 * losses[0], losses


def test_winot_wgrad_refuses_what_it_cannot_hold(queue, rng, torch, record_error, monkeypatch):
    """winot_wgrad's local memory (16 or 4 points of (C + K) x TVP float16, a share of the device's)
    and partial sums (16 x K x C floats a group) are bounded: a conv of 8 -> 4096 channels (whose
    tiles would not fit even one per work-item in 1 MiB; 8 -> 16384 crashed PoCL) trains through the direct
    kernels instead, against float64 torch; and no group count makes more than 64 MiB of partial
    sums."""
    monkeypatch.setenv("NETCL_CPU_WINOT", "1")
    mib = 1024 * 1024

    def groups(c, k, nt, local, cores):
        return conv_route.winot_wgrad_groups(c, k, nt, conv_route.DeviceClass("cpu16", 16, local, cores))
    part_max = tuning.values("winot_wgrad", "cpu16")["part_max"]
    assert groups(8, 4096, 64, mib, 2) is None
    assert groups(256, 256, 64 * 2 * 32, 2 * mib, 64) is None  # 256 -> 256 at 64x64, batch 64
    for local in (mib, 2 * mib, 256 * 1024):
        for cores in (1, 2, 16):
            for c, k, nt in ((16, 16, 1024), (64, 64, 64), (128, 256, 32)):  # resnet8's stages, detector26's 8th conv
                rows, tv, chunks, g = groups(c, k, nt, local, cores)
                assert tv * chunks * g >= nt and 4 * rows * 64 * ((c + k) * conv_route._wgrad_row(tv) + 2) <= local
                assert 4 * g * 16 * k * c <= part_max
    rows, tv, _, _ = groups(4, 4, 512, 2 * mib, 2)  # rows of 64 vectors (4 KiB): one more
    assert (rows, tv) == (4, 64) and conv_route._wgrad_row(tv) == 65
    layer = nn.Conv2d(8, 4096, 3, padding=1, bias=False)
    if ops.is_cpu(queue):  # (a budget of 1 MiB's share, whatever the device's local memory: 2 MiB holds a tile)
        t = tuning.values("winot_wgrad", ops.config_class(queue))
        monkeypatch.setitem(t, "share", t["share"] * mib / ops.local_mem(queue))
        assert layer.route(queue, (1, 8, 8, 8)).winot is not None  # the forward still runs conv_winot
    wgrads = []
    monkeypatch.setattr(conv_module, "_winot_wgrad", lambda *a, **kw: wgrads.append(a) or winot_wgrad(*a, **kw))
    test_conv2d_groups_dilation_vs_torch(queue, rng, torch, record_error, 1, 8, 8, 8, 4096, 3, 1, 1, 1, 1, False)
    assert not wgrads
