"""Conv2d (grouped, depthwise, dilated) and ConvTranspose2d.

A Conv2d whose kernel, stride, padding and dilation are the same along height and width (ints, or
pairs of equal values) trains by the routes below. One that differs between them (a (1, 5) kernel,
stride (2, 1), ...) or whose padding="same" pads one side more (an even kernel) runs the column
route of netcl.nn.conv_cols (im2col, GEMM per group, col2im), on every device.

Which kernels a Conv2d trains with, forward, weight gradient and data gradient together, is one
decision: netcl.nn.conv_route's conv_route(spec, device class), made at forward time (Conv2d.route)
and read back by the backward from what the forward saved (_Saved). On GPUs and for grouped
convolutions: im2col + GEMM (kernels/conv.cl, gemm.cl; groups=1 batches the GEMM over the images,
other groups over the groups); depthwise convolutions (groups == in_channels) run direct kernels.
On CPUs, undilated 3x3 and 5x5 convolutions of stride 1 or 2 run direct kernels
(kernels/convtrain_cpu.cl): no im2col columns in the forward and the data gradient, no col2im;
3x3 stride-1 padding-1 ones of 8 or more channels run their forward and data gradient as Winograd
F(2x2, 3x3) where its vectors tile the planes (the fused path's conv_winot.cl on the padded planes
the direct kernels use, the weights transformed on the device each step; NETCL_CPU_WINOT=0|1
overrides the device's choice). Register blocks and cut-offs: the tuning table (netcl.tuning).
ConvTranspose2d is the convolution's data gradient: forward is GEMM + col2im, its input gradient
is im2col + GEMM."""
import math
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

import netcl.runtime as runtime
from netcl import ops, tuning
from netcl.convspec import winot_choice
from netcl.nn.conv_route import FAMILY as _FAMILY
from netcl.nn.conv_route import (ROWS1, ConvRoute, ConvSpec, DeviceClass, bordered_extent, conv_route, cpu_options,
                                 narrow_launch, oc16_launch)
from netcl.nn import conv_cols
from netcl.nn.module import (MAX_PADDING, Module, as_bool, check_rank, conv_out, int_or_pair, pair, positive,
                             uniform)

_RED = 64  # work-group size of the reductions in conv.cl (RED)
_GPU_LOCAL = 256  # work-group size of im2col_gpu and col2im_gpu
_WG2_VW, _WG2_O = 16, 8  # wgrad2_cpu's positions a vector and output channels a work-item (its defines)
_cpu_options = cpu_options
_bordered_extent = bordered_extent


def _blocks(q):
    """The tuning table's convtrain_cpu.cl blocks for the queue's device class."""
    return tuning.values("conv_train", ops.config_class(q))


def _cutoffs(q):
    return tuning.values("conv_cutoffs", ops.config_class(q))


def device_class(q):
    """The DeviceClass conv routes are chosen for on queue q (NETCL_CPU_WINOT read per call)."""
    return DeviceClass(ops.config_class(q), ops.float_lanes(q), ops.local_mem(q), ops.compute_units(q),
                       winot_choice(os.environ.get("NETCL_CPU_WINOT")))


@dataclass
class _SavedCols:
    """What a Conv2d of the column route (conv_cols) keeps for its backward: its geometry and columns."""
    geometry: conv_cols.Cols
    cols: object


def conv_padding(padding, stride):
    """Conv2d's padding argument: an int or (height, width) pair (int_or_pair), "valid" as 0, or
    "same" (stride 1 only, as PyTorch)."""
    if isinstance(padding, str):
        if padding == "valid":
            return 0
        if padding != "same":
            raise ValueError(f"padding must be an int, a pair of ints, 'same' or 'valid', got {padding!r:.50}")
        if stride != 1:
            raise ValueError("padding='same' is not supported for strided convolutions (as PyTorch)")
        return padding
    return int_or_pair("padding", padding, 0, MAX_PADDING)


def same_pads(kernel_size, dilation):
    """(top, left, bottom, right) of padding="same": dilation * (kernel - 1) per axis, the odd
    one of an even kernel at the bottom and right (as PyTorch)."""
    (kh, kw), (dh, dw) = pair(kernel_size), pair(dilation)
    th, tw = dh * (kh - 1), dw * (kw - 1)
    return th // 2, tw // 2, th - th // 2, tw - tw // 2


@dataclass
class _Saved:
    """What a Conv2d's training forward keeps for its backward: the input's shape, the route it ran,
    and, as the route needs them, the input (x), its zero-bordered planes (xp) or im2col columns."""
    shape: tuple
    route: ConvRoute
    x: Optional[object] = None
    xp: Optional[object] = None
    cols: Optional[object] = None


def _im2col(q, n, c, h, w, k, s, p, d, oh, ow, x, cols):
    """cols (c*k*k, n*oh*ow) from x (n, c, h, w): on GPUs one work-item per element of cols
    (coalesced); on CPUs, undilated, x copied into zero-bordered planes and im2col_cpu's rows of
    vectors from them (conv.cl's im2col copies one bounds-checked value at a time, several times
    slower on CPUs), else one work-item per row of cols."""
    args = (n, c, h, w, k, s, p, d, oh, ow, x, cols)
    if ops.config_class(q) == "gpu":
        ops.launch(q, "conv", "im2col_gpu", (cols.size,), (_GPU_LOCAL,), *args)
    elif d == 1:
        xp = ops.new(q, (n, c) + _bordered_extent(h, w, k, s, p, oh, ow))
        _pad_planes(q, x, xp, p, None, _cpu_options(k))
        rows, items = ops.cpu_rows(n * oh, ow)
        ops.launch(q, _FAMILY, "im2col_cpu", (c * k * k, items), (1, 1), c, xp.shape[2], xp.shape[3], oh, ow, s,
                   n * oh, rows, xp, cols, options=_cpu_options(k))
    else:
        ops.launch(q, "conv", "im2col", (n * oh, c * k * k), (8, 1), *args)
    return cols.mark_written()


def _col2im(q, n, c, h, w, k, s, p, d, oh, ow, dcols, bias, out):
    """out (n, c, h, w) = the gather of dcols (c*k*k, n*oh*ow) (+ bias): on GPUs one work-item per
    element of out, on CPUs rows of it in vectors (convtrain_cpu.cl)."""
    has_bias = bias is not None
    bias_arg = bias if has_bias else ops.dummy(q)
    if ops.config_class(q) == "gpu":
        ops.launch(q, "conv", "col2im_gpu", (out.size,), (_GPU_LOCAL,), n, c, h, w, k, s, p, d, oh, ow, dcols,
                   bias_arg, int(has_bias), out)
    else:
        rows, items = ops.cpu_rows(n * c * h, w)
        ops.launch(q, _FAMILY, "col2im_cpu", (items,), (1,), n * c * h, rows, c, h, w, k, s, p, d, oh, ow,
                   dcols, bias_arg, int(has_bias), out, options=_cpu_options(k))
    out.mark_written()


def _corr_cpu(q, inp, w, out, sco, sci, bias=None, stats=False):
    """out (N, CO, OH, OW) = corr_cpu's correlation of the zero-bordered planes inp (N, CI, HP, WP)
    with the weights w (element strides sco per output and sci per input channel; a data gradient
    passes them with their taps reversed: _taps_reversed) (+ bias). With `stats`, where its tiles cover the planes exactly,
    also out's batch-statistics parts for a BatchNorm2d after it, returned as (part, parts, values
    per part, True: a part's channels together); else None."""
    n, co, oh, ow = out.shape
    _, ci, hp, wp = inp.shape
    blocks = _blocks(q)
    k, rm, rr = math.isqrt(w.size // (co * ci)), min(blocks["RM"], 8 if co >= 8 else 4), blocks["RR"]
    cb, has_bias = -(-co // rm), bias is not None
    stats = stats and ow % 16 == 0 and oh % rr == 0
    parts = n * (oh // rr) * (ow // 16)
    part = ops.new(q, (parts, co, 2)) if stats else None  # a part's channels together
    ops.launch(q, _FAMILY, "corr_cpu", (-(-oh // rr), n * cb), (1, 1), ci, co, oh, ow, hp, wp, cb, sco, sci,
               inp, w, bias if has_bias else ops.dummy(q), int(has_bias), out, int(stats), part if stats else out,
               options=_cpu_options(k, rm, rr=rr))
    out.mark_written()
    return (part.mark_written(), parts, 16 * rr, True) if stats else None


def _corrc_cpu(q, inp, w, out, stride, flip, bias=None, unpad=False, stats=False):
    """out (N, CO, OH, OW) = corrc_cpu's correlation (stride `stride`) of the zero-bordered planes
    inp (N, CI, HP, WP) with w (CO, CI, k, k), or with w (CI, CO, k, k) flipped (flip: a data
    gradient), through its channel-last packing (+ bias); `unpad`: inp is a 3x3 stride-2 padding-1
    convolution's input as it is, of even planes (UNPAD). With `stats`, where OW is a multiple of
    its tile, also out's batch-statistics parts for a BatchNorm2d after it, returned as (part,
    parts, values per part, True: a part's channels together); else None."""
    n, co, oh, ow = out.shape
    _, ci, hp, wp = inp.shape
    k, cop = math.isqrt(w.size // (co * ci)), -(-co // 32) * 32
    tc, cw = _blocks(q)["TC"], _blocks(q)["CW"]
    options = _cpu_options(k) + (f"-DTC={tc}", f"-DCW={cw}", f"-DSTRIDE={stride}") + (("-DUNPAD=1",) if unpad else ())
    wt = _pack_weights(q, w, ci, co, k, cop, flip, flip, options)
    xt, has_bias = -(-ow // tc), bias is not None
    stats = stats and ow % tc == 0
    part = ops.new(q, (n * oh * xt, co, 2)) if stats else None  # a part's channels together
    ops.launch(q, _FAMILY, "corrc_cpu", (oh * xt, n * -(-co // cw)), (1, 1), ci, co, cop, oh, ow, hp, wp, xt, stride,
               inp, wt, bias if has_bias else ops.dummy(q), int(has_bias), out, int(stats),
               part if stats else out, options=options)
    out.mark_written()
    return (part.mark_written(), n * oh * xt, tc, True) if stats else None


def _winot(q, inp, w, out, flip, layout, bias, add=False, stats=False):
    """out (N, K, H, W) = the 3x3 stride-1 padding-1 correlation of inp (N, C, H + 2, W + 2: the
    planes with their zero border) with w (K, C, 3, 3), or (flip) with w (C, K, 3, 3) turned by 180
    degrees (a data gradient), + bias (K values), + out where `add` (its layout built with add):
    Winograd F(2x2, 3x3) with 16 output tiles per float16 (conv_winot.cl, the fused CPU path's
    kernel), the weights transformed on the device first. With `stats` (not with add), also out's
    batch-statistics parts for a BatchNorm2d after it, returned as (part, parts, values per part,
    False: a channel's parts together)."""
    n, k, h, wd = out.shape
    c = inp.shape[1]
    if inp.shape[2:] != (h + 2, wd + 2):
        raise ValueError(f"conv_winot reads planes with a border of 1: {inp.shape} for output {out.shape}")
    d, options = layout
    kv, kb = d["KV"], d["KB"]
    u = ops.new(q, (kb * 16 * c * kv,))
    ops.launch(q, "conv_winot", "winot_weights", (kb, c), (1, 1), w, u, int(flip), options=options)
    u.mark_written()
    items = h // 2 // d["T"] * d["VPR"]  # per image
    part = ops.new(q, (k, n * items, 2)) if stats else None
    ops.launch(q, "conv_winot", "conv_winot", (items, n), (1, 1), inp, u, bias, out, out if add else bias,
               part if stats else bias, options=options + (("-DSTATS=1",) if stats else ()))
    out.mark_written()
    return (part.mark_written(), n * items, 64, False) if stats else None


def _winot_wgrad(q, xp, dy, gw, acc, layout, groups, border=0):
    """gw (K, C, 3, 3) (+= where acc) the weight gradient of a 3x3 stride-1 padding-1 convolution
    from its input planes xp (N, C, H + 2, W + 2, with their zero border) and dy (N, K, H, W), or
    dy's zero-bordered planes (N, K, HD, WD) with dy at row and column `border`:
    Winograd F(2x2, 3x3)'s adjoint (conv_winot.cl's winot_wgrad, then winot_wgrad_finish adds its
    groups' sums in order and transforms back); `layout` is the forward's (ConvRoute.winot) and
    `groups` its (ROWS, TV, chunks, groups) (ConvRoute.winot_wgrad)."""
    d, options = layout
    n, k, hd, wd = dy.shape
    c, h, w = xp.shape[1], xp.shape[2] - 2, xp.shape[3] - 2
    nt = n * (h // 2 // d["T"]) * d["VPR"]  # tile vectors
    rows, tv, chunks, groups = groups
    part = ops.new(q, (groups * 16 * k * c,))
    options = options + (f"-DTV={tv}", f"-DROWS={rows}")
    ops.launch(q, "conv_winot", "winot_wgrad", (4 // rows, groups), (1, 1), xp, dy, border * (wd + 1), hd * wd, wd,
               part, nt, chunks, options=options)
    part.mark_written()
    ops.launch(q, "conv_winot", "winot_wgrad_finish", ((k // 4) * (c // 4),), (1,), part, groups, gw, int(acc),
               options=options)
    gw.mark_written()


def _pack_weights(q, w, ci, co, k, cop, transposed, reverse, options):
    """corrc_cpu's and corrt_cpu's channel-last weights wt (ci, k*k, cop) from w (co, ci, k, k) or
    (transposed) w (ci, co, k, k), the taps reversed where `reverse`."""
    wt = ops.new(q, (ci, k * k, cop))
    ops.launch(q, _FAMILY, "pack_weights_cpu", (ci * cop,), (32,), co, ci, cop, int(transposed), int(reverse), w, wt,
               options=options)
    return wt.mark_written()


def _taps_reversed(q, w, k):
    """w (OC, C, k, k) with each filter's taps in reverse order, by pack_weights_cpu (each filter a
    channel of one column): the data gradient's correlation then runs corr_cpu's forward program
    on them, not a flipped one of its own, which PoCL took two to three times as long to
    build as the forward's (its first training step's longest build)."""
    filters = w.size // (k * k)
    out = ops.new(q, w.shape)
    ops.launch(q, _FAMILY, "pack_weights_cpu", (filters,), (32,), 1, filters, 1, 1, 1, w, out,
               options=_cpu_options(k))
    return out.mark_written()


def _corrt_cpu(q, dy, w, dx, stride, padding):
    """dx (N, C, H, W) = the data gradient of a strided convolution with weights w (OC, C, k, k)
    and padding `padding`, from dy (N, OC, OH, OW): corrt_cpu on dy with a zero border."""
    n, c, h, w_ = dx.shape
    _, oc, oh, ow = dy.shape
    # up to 16 channels: one float16 of them per work-item and twice the positions (two would
    # leave half their lanes zero)
    cv = 1 if c <= 16 else 2
    k, s, tc, cop = math.isqrt(w.size // (oc * c)), stride, _blocks(q)["TC"] * (3 - cv), -(-c // (16 * cv)) * 16 * cv
    options, border = _cpu_options(k) + (f"-DTC={tc}", f"-DCV={cv}"), -(-(k - 1) // s)
    dyb = ops.new(q, (n, oc, max(-(-(h + padding) // s), oh) + 2 * border + 1,
                      max(-(-(w_ + padding) // s), ow) + tc + 2 * border + 1))
    _pad_planes(q, dy, dyb, border, None, options)
    wt = _pack_weights(q, w, oc, c, k, cop, True, False, options)
    positions = -(-w_ // s)  # of a row's first phase, the longest
    xt = -(-positions // tc)
    ops.launch(q, _FAMILY, "corrt_cpu", (h * s * xt, n * cop // (16 * cv)), (1, 1), oc, c, cop, h, w_, dyb.shape[2],
               dyb.shape[3], xt, s, padding, border, dyb, wt, dx, options=options)
    dx.mark_written()


def _row_vector(width):
    """The float vector width for rows of `width` outputs (the depthwise CPU kernels' DWV)."""
    return 16 if width >= 16 else 8 if width >= 8 else 4


def _pad_planes(q, src, dst, border, sums, options):
    """dst (N, C, HP, WP) = src (N, C, H, W) at row and column `border` of zero planes (and the
    planes' sums into `sums` unless None)."""
    n, c, h, w = src.shape
    _, _, hp, wp = dst.shape
    planes, items = ops.cpu_rows(n * c, hp * wp)
    ops.launch(q, _FAMILY, "pad_planes_cpu", (items,), (1,), n * c, planes, h, w, hp, wp, border, border,
               src, dst, sums, options=options)
    dst.mark_written()


def _image_chunks(n, floats, items, vectors):
    """(images per chunk, chunks) of a weight gradient's per-chunk partial sums over n images of
    `floats` floats each (input and dy), `items` work-items per chunk and `vectors` additions per
    image to a lane's sum (vectors of dy, or a kernel's flushed runs): a chunk's images stay in L2
    while its work-items run, no lane of a work-item adds more than chunk_run of them (then
    sum_chunks_cpu adds the chunks in order), and the chunks give every core work (the tuning
    table's conv_cutoffs: wgrad_l2, chunk_run, wgrad_items)."""
    cut = tuning.values("conv_cutoffs", "*")
    chunk = max(1, min(n, cut["wgrad_l2"] // (4 * floats), cut["chunk_run"] // vectors))
    while chunk > 1 and items * -(-n // chunk) < cut["wgrad_items"]:
        chunk = -(-chunk // 2)
    return chunk, -(-n // chunk)


def _sum_chunks(q, size, chunks, part, out, accumulate):
    """out (size values) (+)= the sum of part (chunks, size) over its chunks, in order (sum_chunks_cpu)."""
    ops.launch(q, _FAMILY, "sum_chunks_cpu", (-(-size // 16),), (1,), size, chunks, part, out, accumulate)


def _check_groups(in_channels, out_channels, groups):
    groups = positive("groups", groups)
    for what, c in (("in_channels", in_channels), ("out_channels", out_channels)):
        if c % groups:
            raise ValueError(f"{what} ({c}) must be divisible by groups ({groups})")
    return groups


def _channel_sum(dy, p):
    """p.grad (+)= the sum of dy (N, C, ...) over everything but the channel axis."""
    n, c = dy.shape[:2]
    g, acc = ops.grad_target(p)
    ops.launch(dy.queue, "conv", "channel_sum", (c * _RED,), (_RED,), n, c, dy.size // (n * c), dy, g, int(acc))
    g.mark_written()


class Conv2d(Module):
    """Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True): (N, C, H, W) -> (N, K, H', W'), weight (K, C/groups, kH, kW), PyTorch's semantics; kernel_size, stride, padding and dilation each an int or a (height, width) pair, padding also "same" (stride 1) or "valid"."""
    CALL_STATE = ("_saved", "_out_stats")
    STR_ARGS = ("padding",)  # "same" (files hold it; the constructor checks the string)
    PAIR_ARGS = ("kernel_size", "stride", "padding", "dilation")  # files hold a pair as a list of two

    # x: (N, C, H, W) -> (N, K, H', W'); weight (K, C/groups, kH, kW)
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True):
        super().__init__()
        self.in_channels = positive("in_channels", in_channels)
        self.out_channels = positive("out_channels", out_channels)
        self.kernel_size = int_or_pair("kernel_size", kernel_size, 1)
        self.stride = int_or_pair("stride", stride, 1)
        self.padding = conv_padding(padding, self.stride)
        bias = as_bool("bias", bias)
        self.dilation = int_or_pair("dilation", dilation, 1)
        self.groups = _check_groups(self.in_channels, self.out_channels, groups)
        shapes = self.tensor_shapes(self.in_channels, self.out_channels, self.kernel_size, groups=self.groups,
                                    bias=bias)
        kh, kw = pair(self.kernel_size)
        bound = 1.0 / math.sqrt(self.in_channels // self.groups * kh * kw)
        self.weight = uniform(bound, shapes["weight"])
        self.bias = uniform(bound, shapes["bias"]) if bias else None
        self._params = {"weight": self.weight, **({"bias": self.bias} if bias else {})}

    @classmethod
    def tensor_shapes(cls, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                      bias=True):
        (kh, kw), g = pair(int_or_pair("kernel_size", kernel_size, 1)), _check_groups(in_channels, out_channels, groups)
        return {"weight": (out_channels, in_channels // g, kh, kw), **({"bias": (out_channels,)} if bias else {})}

    def config(self):
        return {"in_channels": self.in_channels, "out_channels": self.out_channels,
                "kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding,
                "dilation": self.dilation, "groups": self.groups, "bias": self.bias is not None}

    def extra_repr(self):
        # dilation and groups only when set, as PyTorch prints them (ONNX doc strings quote the repr,
        # so models without them keep exporting to the same bytes)
        """The constructor's arguments as they read in repr()."""
        return ", ".join(f"{k}={v!r}" for k, v in self.config().items()
                         if not (k in ("dilation", "groups") and v == 1))

    @property
    def general(self):
        """Whether this conv runs the column route (conv_cols): its geometry differs between height
        and width, or padding="same" pads one side more (an even kernel). The square, symmetric
        ones ("same" of an odd kernel among them: its int padding) train by conv_route's routes
        and fuse in predict()'s conv stages."""
        return len(set(self.pads())) > 1 or any(isinstance(v, tuple) for v in
                                                (self.kernel_size, self.stride, self.dilation))

    def pads(self):
        """(top, left, bottom, right) zero padding (ONNX's order)."""
        if self.padding == "same":
            return same_pads(self.kernel_size, self.dilation)
        ph, pw = pair(self.padding)
        return ph, pw, ph, pw

    def output_shape(self, shape):
        check_rank("Conv2d", shape, 4, "(N, C, H, W)")
        n, c, h, w = shape
        if c != self.in_channels:
            raise ValueError(f"Conv2d expects {self.in_channels} input channels, got shape {tuple(shape)}")
        if self.general:
            (kh, kw), (sh, sw), (dh, dw) = pair(self.kernel_size), pair(self.stride), pair(self.dilation)
            top, left, bottom, right = self.pads()
            oh, ow = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1, (w + left + right - dw * (kw - 1) - 1) // sw + 1
        else:
            span = self.dilation * (self.kernel_size - 1) + 1
            oh, ow = (conv_out(v, span, self.stride, self.pads()[0]) for v in (h, w))
        if oh < 1 or ow < 1:
            raise ValueError(f"Conv2d kernel {self.kernel_size} (dilation {self.dilation}, padding {self.padding}) "
                             f"does not fit input {h}x{w}")
        return (n, self.out_channels, oh, ow)

    def macs(self, shape):
        n, k, oh, ow = self.output_shape(shape)
        kh, kw = pair(self.kernel_size)
        return n * k * oh * ow * (self.in_channels // self.groups) * kh * kw

    def _cols(self, shape):
        """The column route's geometry (conv_cols.Cols) at input `shape`."""
        n, c, h, w = shape
        _, k, oh, ow = self.output_shape(shape)
        (kh, kw), (sh, sw), (dh, dw) = pair(self.kernel_size), pair(self.stride), pair(self.dilation)
        top, left, _, _ = self.pads()
        return conv_cols.Cols(n, c, h, w, k, oh, ow, kh, kw, sh, sw, top, left, dh, dw, self.groups)

    def _geometry(self):
        return self.kernel_size, self.stride, self.pads()[0], self.dilation

    def _depthwise(self):
        return self.groups > 1 and self.groups == self.in_channels

    def spec(self, shape):
        """This conv at input `shape` as conv_route's ConvSpec."""
        n, c, h, w = shape
        return ConvSpec(n, c, h, w, self.out_channels, self.kernel_size, self.stride, self.pads()[0], self.dilation,
                        self.groups)

    def route(self, q, shape):
        """The ConvRoute this conv trains with at input `shape` on queue q (netcl.nn.conv_route), kept
        per queue, shape and device class. Where the full route's specialised kernels are not built
        yet and kernels build in the background (netcl.runtime.tiers), the generic tier's route,
        the others handed to the background thread: decided anew once it has built them. Both
        tiers read their input from the same planes, and the backward runs the route the forward
        saved (_Saved), so a change between two calls of one step changes nothing of that step."""
        routes = self.__dict__.setdefault("_routes", {})
        d, mode = device_class(q), runtime.tiers.mode()
        key = (q.int_ptr, tuple(shape), d, mode, tuning.version())
        held = routes.get(key)
        if held is not None and (held[0].tier == "specialised" or held[1] == runtime.tiers.generation()):
            return held[0]
        generation = runtime.tiers.generation()
        r = conv_route(self.spec(shape), d)
        if r.kernels and mode == "background" and not runtime.kernels_ready(q, r.kernels):
            runtime.tiers.build_later(q, r.kernels)
            r = conv_route(self.spec(shape), d, generic=True)
        routes[key] = (r, generation)
        return r

    def route_kernels(self):
        """The specialised kernels (family, kernel, options) of the routes this conv has chosen so
        far (ConvRoute.kernels; netcl.warmup builds them all ahead of time)."""
        return tuple(k for r, _ in self.__dict__.get("_routes", {}).values() for k in r.kernels)

    def _zeros(self, q, size):
        """A zero device tensor of `size` floats, made once per size and queue (conv_winot's bias
        where there is none: out_channels of them forward, in_channels for the data gradient)."""
        cache = self.__dict__.setdefault("_zero_bias", {})
        z = cache.get((size, q.int_ptr))
        if z is None:
            z = cache[(size, q.int_ptr)] = ops.new(q, (size,)).fill_(0.0)
        return z

    def _bias_or_zeros(self, q):
        return self.bias if self.bias is not None else self._zeros(q, self.out_channels)

    def padded_input(self, q, shape):
        """(top, left, HP, WP): the zero-bordered planes this conv's CPU training forward copies
        its input `shape` into (the "winot", "rows" and "channels" routes), so that the layer before
        it can write them instead (Sequential: a BatchNorm2d's pass, then forward_padded); None where
        the forward reads its input as it is (the column route's too)."""
        return None if self.general else self.route(q, shape).planes

    def forward(self, x, stats=False):
        """y = conv(x); with `stats` (Sequential's training path, a BatchNorm2d next), a kernel that
        can (conv_winot, corr_cpu, corrc_cpu, pw2_fwd_cpu) also computes y's batch-statistics parts
        (output_statistics)."""
        q = self._on(x)
        out_shape = self.output_shape(x.shape)  # checks the rank first
        self._out_stats = None
        if self.general:
            g = self._cols(x.shape)
            y, cols = conv_cols.forward(q, x, self.weight, self.bias, g, out_shape)
            self._saved = _SavedCols(g, cols)
            return y
        r = self.route(q, x.shape)
        if r.planes is not None:  # x with its zero border, then the direct kernels
            top, _, hp, wp = r.planes
            xp = ops.new(q, x.shape[:2] + (hp, wp))
            _pad_planes(q, x, xp, top, None, _cpu_options(self.kernel_size))
            return self._forward_padded(xp, x.shape, out_shape, stats)
        if r.forward == "phases":  # corrc_cpu on x as it is (UNPAD); backward: _backward_phases
            y = ops.new(q, out_shape)
            st = _corrc_cpu(q, x, self.weight, y, 2, 0, self.bias, unpad=True, stats=stats)
            self._saved = _Saved(x.shape, r, x=x)
            self._out_stats = (y,) + st if st else None
            return y
        return self._forward_other(x, out_shape, r, stats)

    def forward_padded(self, xp, shape):
        """forward() of an input of `shape` given as the zero-bordered planes xp that padded_input
        describes (the direct CPU kernels read them without bounds checks)."""
        q = xp.queue
        out_shape = self.output_shape(shape)
        geometry = self.padded_input(q, shape)
        if geometry is None or xp.shape != tuple(shape[:2]) + geometry[2:]:
            raise ValueError(f"Conv2d.forward_padded: planes {xp.shape} are not the {geometry} this conv pads "
                             f"input {tuple(shape)} into")
        return self._forward_padded(xp, shape, out_shape)

    def output_statistics(self, y):
        """(part, parts, values per part, part_major): the batch-statistics parts of y per channel
        (norm.cl's layout, or corr_cpu's and corrc_cpu's part-major one; for BatchNorm2d.forward's
        `stats`) where y is this conv's last output and its kernel computed them (forward with
        stats: conv_winot, corr_cpu, corrc_cpu, pw2_fwd_cpu); else None."""
        st = getattr(self, "_out_stats", None)
        return st[1:] if st is not None and st[0] is y else None

    def _forward_padded(self, xp, shape, out_shape, stats=False):
        q = self._on(xp)  # the parameters on xp's device (Sequential calls this without forward())
        r = self.route(q, shape)
        (_, oc, oh, ow), (n, c) = out_shape, shape[:2]
        k, s, _, _ = self._geometry()
        y = ops.new(q, (n, oc, oh, ow))
        if r.forward == "winot":
            st = _winot(q, xp, self.weight, y, 0, r.winot, self._bias_or_zeros(q), stats=stats)
        elif r.forward == "rows":
            st = _corr_cpu(q, xp, self.weight, y, c * k * k, k * k, self.bias, stats=stats)
        else:
            st = _corrc_cpu(q, xp, self.weight, y, s, 0, self.bias, stats=stats)
        self._out_stats = (y,) + st if st else None
        self._saved = _Saved(tuple(shape), r, xp=xp)  # backward's weight gradient reads the padded x
        return y

    def _forward_other(self, x, out_shape, r, stats=False):
        q = x.queue
        _, oc, oh, ow = out_shape
        n, c, h, w = x.shape
        k, s, p, d = self._geometry()
        y = ops.new(q, (n, oc, oh, ow))
        if r.forward in ("depthwise", "depthwise_any"):
            has_bias = self.bias is not None
            bias = self.bias if has_bias else ops.dummy(q)
            xp = None
            if r.forward == "depthwise":  # whole vectors of a row on zero-bordered planes
                vw = _row_vector(ow)
                xp = ops.new(q, (n, c) + _bordered_extent(h, w, k, s, p, oh, -(-ow // vw) * vw))
                _pad_planes(q, x, xp, p, None, _cpu_options(k))
                planes, items = ops.cpu_rows(n * oc, oh * ow * k * k)
                ops.launch(q, _FAMILY, "dw_fwd_cpu", (items,), (1,), n * oc, planes, c, oc // c, oh, ow, xp.shape[2],
                           xp.shape[3], xp, self.weight, bias, int(has_bias), y,
                           options=_cpu_options(k) + (f"-DDWV={vw}", f"-DDWS={s}"))
            else:
                ops.launch1d(q, "conv", "dw_forward", n * oc * oh, n, c, h, w, oc // c, k, s, p, d, oh, ow, x,
                             self.weight, bias, int(has_bias), y)
            self._saved = _Saved(x.shape, r, x=x, xp=xp)  # xp: the bordered planes dw_bwd_weight_cpu reads too
            return y.mark_written()
        if r.forward == "pointwise2":
            has_bias, vectors = self.bias is not None, n * oh * ow // 16
            st = ops.new(q, (oc, vectors, 2)) if stats else None
            ops.launch(q, _FAMILY, "pw2_fwd_cpu", (vectors,), (1,), c, oc, oh, ow, x,
                       self.weight, self.bias if has_bias else ops.dummy(q), int(has_bias), y,
                       int(stats), st if stats else y, options=r.stride2)
            self._saved = _Saved(x.shape, r, x=x)
            self._out_stats = (y, st.mark_written(), vectors, 16, False) if stats else None
            return y.mark_written()
        G, P, ckk = self.groups, oh * ow, c * k * k
        cols = ops.new(q, (ckk, n * P))
        _im2col(q, n, c, h, w, k, s, p, d, oh, ow, x, cols)
        if G == 1:
            ops.gemm(oc, P, ckk, self.weight, (ckk, 1, 0), cols, (n * P, 1, P), y, (P, 1, oc * P),
                     bias=self.bias, bias_mode=2 if self.bias is not None else 0, batch=n)
        else:  # one GEMM batched over the groups into (OC, N*P), then into (N, OC, P) with the bias
            ocg, ckg, NP = oc // G, ckk // G, n * P
            t = ops.gemm(ocg, NP, ckg, self.weight, (ckg, 1, ocg * ckg), cols, (NP, 1, ckg * NP),
                         ops.new(q, (oc, NP)), (NP, 1, ocg * NP), batch=G)
            has_bias = self.bias is not None
            ops.launch1d(q, "conv", "cn_to_nchw", y.size, n, oc, P, t, self.bias if has_bias else ops.dummy(q),
                         int(has_bias), y)
            y.mark_written()
        self._saved = _Saved(x.shape, r, cols=cols)
        return y

    def backward(self, dy):
        return self._backward(dy, True)

    def backward_into(self, dy, acc, act=None):
        """acc += backward(dy) (a Residual's shortcut into the body's gradient): on a CPU a 1x1
        convolution without padding adds its data gradient straight into acc (pw2_dgrad_cpu at
        stride 2 on the planes the "pointwise2" route takes, else its GEMM's columns: no gradient
        tensor of its own); otherwise backward() and a sum. With `act` (an ops.ActGrad: the
        activation whose output is this layer's input, a Residual's that ran in its sum), the sum
        comes back through that activation's gradient: pw2_dgrad_cpu's own pass (DX_ACT), else
        act_bwd_cpu."""
        if isinstance(self._saved, _SavedCols):
            ops.add(acc, self._backward(dy, True), out=acc)
            return ops.through_act(acc.mark_written(), act)
        k, s, p, d = self._geometry()
        cpu_1x1 = (k, p, d, self.groups) == (1, 0, 1, 1) and ops.is_cpu(dy.queue)
        route = self._saved.route
        if cpu_1x1 and route.forward == "pointwise2":
            return self._backward_pointwise2(dy, True, acc, act)  # (_backward_cpu's path for it)
        if cpu_1x1 and route.forward == "gemm":
            self._backward_cpu(dy, True, into=acc)
        else:
            ops.add(acc, self._backward(dy, True), out=acc)
        return ops.through_act(acc.mark_written(), act)

    def backward_params(self, dy):
        self._backward(dy, False)

    def _backward(self, dy, need_dx):
        """The gradients of weight and bias; dx too unless need_dx is False (then None)."""
        if isinstance(self._saved, _SavedCols):
            g, cols = self._saved.geometry, self._saved.cols
            rows = conv_cols.rows_of(dy, g)
            conv_cols.weight_grad(rows, cols, self.weight, g)
            if self.bias is not None:
                _channel_sum(dy, self.bias)
            return conv_cols.data_grad(dy.queue, rows, self.weight, g, (g.n, g.c, g.h, g.w)) if need_dx else None
        route = self._saved.route
        if route.forward in ("depthwise", "depthwise_any"):
            return self._backward_depthwise(dy, need_dx)
        if route.wgrad != "gemm":
            return self._backward_cpu(dy, need_dx)
        (n, c, h, w), cols = self._saved.shape, self._saved.cols
        _, oc, oh, ow = dy.shape
        k, s, p, d = self._geometry()
        q, P, ckk, G = dy.queue, oh * ow, c * k * k, self.groups
        NP, ocg, ckg = n * P, oc // G, ckk // G
        dyp = ops.permute3(dy, (n, oc, P), (oc * P, P, 1), ops.new(q, (oc, NP)), (P, NP, 1))
        gw, acc = ops.grad_target(self.weight)
        # per group: dW_g (ocg, ckg) = dy_g (ocg, NP) @ cols_g^T; dcols_g = W_g^T @ dy_g
        ops.gemm(ocg, ckg, NP, dyp, (NP, 1, ocg * NP), cols, (1, NP, ckg * NP), gw, (ckg, 1, ocg * ckg),
                 beta=float(acc), batch=G)
        if self.bias is not None:
            gb, acc = ops.grad_target(self.bias)
            ops.sum_axis(dyp, NP, oc, 1, NP, gb, accumulate=acc)
        if not need_dx:
            return None
        dcols = ops.gemm(ckg, NP, ocg, self.weight, (1, ckg, ocg * ckg), dyp, (NP, 1, ocg * NP),
                         ops.new(q, (ckk, NP)), (NP, 1, ckg * NP), batch=G)
        dx = ops.new(q, (n, c, h, w))
        _col2im(q, n, c, h, w, k, s, p, d, oh, ow, dcols, None, dx)
        return dx

    def _backward_cpu(self, dy, need_dx, into=None):
        """backward() on a CPU, groups == 1 (convtrain_cpu.cl), by the route the forward ran: where
        every read of dy is of its zero-bordered planes (ConvRoute.takes_dy_planes), _backward_padded;
        after a "pointwise2" forward, _backward_pointwise2; wgrad2o / wgrad2, _backward_phases.
        Otherwise one pass over dy gives the weight gradient's GEMM operand (OC, N*P) and the bias
        gradient's sums, and dW = dy @ cols^T (cols from im2col after a "channels" forward, of its
        padded x, or a "phases" one on rows of other widths, of x as it is; or the forward's own),
        where no direct kernel (narrow, oc16) takes dW and db in one launch; dx by the route's data
        gradient: the flipped correlation of dy's zero-bordered planes ("winot", "channels"),
        corrt2_cpu's phases, corrt_cpu, a 1x1 convolution's W^T dy per image straight into dx, else
        dcols = W^T dy and col2im (added into `into` for a 1x1 convolution: backward_into)."""
        saved = self._saved
        r = saved.route
        if r.takes_dy_planes:
            return self._backward_padded(dy, None, need_dx, dy.shape, r.dy_planes)
        if r.forward == "pointwise2":
            return self._backward_pointwise2(dy, need_dx, into)
        if r.wgrad in ("wgrad2o", "wgrad2"):
            return self._backward_phases(dy, need_dx, r.stride2)
        (n, c, h, w) = saved.shape
        _, oc, oh, ow = dy.shape
        k, s, p, d = self._geometry()
        q, P, ckk = dy.queue, oh * ow, c * k * k
        if r.wgrad in ("narrow", "oc16"):  # dW and db in one launch from dy and the forward's padded x
            (self._wgrad_narrow if r.wgrad == "narrow" else self._wgrad_oc16)(q, saved.xp, dy)
            return self._dx_of_planes(self._padded_dy(q, dy, r), r) if need_dx else None
        if r.wgrad in ("gemm_planes", "gemm_unpad"):  # im2col here, from the forward's padded x or x as it is
            src, cols = (saved.xp if r.wgrad == "gemm_planes" else saved.x), ops.new(q, (ckk, n * P))
            rows, items = ops.cpu_rows(n * oh, ow)
            ops.launch(q, _FAMILY, "im2col_cpu", (ckk, items), (1, 1), c, src.shape[2], src.shape[3], oh, ow, s, n * oh,
                       rows, src, cols, options=_cpu_options(k) + (("-DUNPAD=1",) if r.wgrad == "gemm_unpad" else ()))
        else:
            cols = saved.cols
        NP, options = n * P, _cpu_options(k)
        dyp, sums = ops.new(q, (oc, NP)), ops.new(q, (n * oc,))
        rows, items = ops.cpu_rows(n * oc, P)
        ops.launch(q, _FAMILY, "dy_rows_cpu", (items,), (1,), n * oc, rows, oc, P, NP, dy, dyp, sums,
                   options=options)
        gw, acc = ops.grad_target(self.weight)
        ops.gemm(oc, ckk, NP, dyp, (NP, 1, 0), cols, (1, NP, 0), gw, (ckk, 1, 0), beta=float(acc))
        self._bias_grad_cpu(n, oc, sums)
        if not need_dx:
            return None
        if r.dgrad in ("winot", "channels"):
            return self._dx_of_planes(self._padded_dy(q, dy, r), r)
        if r.dgrad in ("corrt2", "corrt2p"):
            return self._corrt2(dy, ops.new(q, (n, c, h, w)), r.stride2)
        if r.dgrad == "corrt":
            dx = ops.new(q, (n, c, h, w))
            _corrt_cpu(q, dy, self.weight, dx, s, p)
            return dx
        if r.dgrad == "gemm_1x1" and into is None:  # 1x1: dx[n] = W^T dy[n] straight into NCHW, no col2im
            dx = ops.new(q, (n, c, h, w))
            return ops.gemm(c, P, oc, self.weight, (1, c, 0), dy, (P, 1, oc * P), dx, (P, 1, c * P), batch=n)
        dcols = ops.gemm(ckk, NP, oc, self.weight, (1, ckk, 0), dyp, (NP, 1, 0), ops.new(q, (ckk, NP)), (NP, 1, 0))
        if into is not None:  # backward_into: a 1x1 convolution's columns added into `into`
            rows, items = ops.cpu_rows(n * c * oh, ow)
            ops.launch(q, _FAMILY, "col2im_1x1_add_cpu", (items,), (1,), n * c * oh, rows, c, h, w, oh, ow, s,
                       dcols, into, options=options)
            return into
        dx = ops.new(q, (n, c, h, w))
        _col2im(q, n, c, h, w, k, s, p, d, oh, ow, dcols, None, dx)
        return dx

    def _padded_dy(self, q, dy, r):
        """dy in the zero-bordered planes _dx_of_planes correlates with the flipped weights."""
        pd, _, hd, wd = r.dy_planes
        dyb = ops.new(q, (dy.shape[0], dy.shape[1], hd, wd))
        _pad_planes(q, dy, dyb, pd, None, _cpu_options(self.kernel_size))
        return dyb

    def _input_of(self, dy_shape):
        """The input shape of a stride-1 conv whose output gradient has dy_shape."""
        n, _, oh, ow = dy_shape
        k, _, p, d = self._geometry()
        span = d * (k - 1)
        return n, self.in_channels, oh + span - 2 * p, ow + span - 2 * p

    def _wgrad_narrow(self, q, xp, dy):
        """dW and db of a "channels" convolution of stride 1 with few weights per output channel
        in one wgrad_narrow_cpu launch from dy and the forward's padded x (no im2col columns, no
        GEMM): rows of 4 or 8 two to a vector (PAIR) where their number is even, else a row a vector;
        split over images (partial sums, then sum_chunks_cpu) only where the output channels
        alone leave the cores idle on a long sum (conv_route.narrow_launch's sizes)."""
        n, oc, oh, ow = dy.shape
        a = narrow_launch(self.spec(self._input_of(dy.shape)), device_class(q))
        gw, acc_w = ops.grad_target(self.weight)
        gb, acc_b = ops.grad_target(self.bias) if self.bias is not None else (ops.dummy(q), False)
        chunks = a["chunks"]
        part, partb = (ops.new(q, (chunks, self.weight.size)), ops.new(q, (chunks, oc))) if chunks > 1 else (None, None)
        ops.launch(q, _FAMILY, "wgrad_narrow_cpu", (a["items"], chunks), (1, 1), n, xp.shape[2], xp.shape[3], oc, oh,
                   ow, a["imgs"], a["run"], xp, dy, gw, gb, int(self.bias is not None), int(acc_w), int(acc_b), part,
                   partb, options=a["options"])
        if chunks > 1:
            _sum_chunks(q, self.weight.size, chunks, part, gw, int(acc_w))
            if self.bias is not None:
                _sum_chunks(q, oc, chunks, partb, gb, int(acc_b))
        gw.mark_written()
        if self.bias is not None:
            gb.mark_written()

    def _wgrad_oc16(self, q, xp, dy):
        """dW and db in one wgrad_oc16_cpu launch from dy and the forward's padded x (no im2col
        columns, no GEMM, no separate bias sums): blocks of 16 output channels x 16 weights, about
        oc16_items work-items per compute unit (conv_route.oc16_launch's sizes)."""
        n, oc, oh, ow = dy.shape
        a = oc16_launch(self.spec(self._input_of(dy.shape)), device_class(q), xp.shape[3])
        gw, acc_w = ops.grad_target(self.weight)
        gb, acc_b = ops.grad_target(self.bias) if self.bias is not None else (ops.dummy(q), False)
        ops.launch(q, _FAMILY, "wgrad_oc16_cpu", (a["items"],), (1,), n, self.in_channels, xp.shape[2], oc, oh * ow,
                   a["tgroups"], xp, dy, gw, gb, int(self.bias is not None), int(acc_w), int(acc_b),
                   options=a["options"])
        gw.mark_written()
        if self.bias is not None:
            gb.mark_written()

    def pool_wgrad(self, q, dy_shape):
        """(kernel options, the forward's padded input) with which a BatchNorm2d after this conv,
        its forward fused with a 2x2 MaxPool2d, computes this conv's weight and bias gradients in
        its own backward pass instead of dx (norm_cpu.cl's bn_pool_bwd_wgrad_cpu; Sequential, when
        this conv needs no data gradient): where the route the forward ran allows it
        (ConvRoute.pool_wgrad: a stride-1 "channels" forward, few weights per output channel, dy in
        rows of 8 and an even number of rows). None otherwise."""
        saved = getattr(self, "_saved", None)
        if not isinstance(saved, _Saved) or saved.route.pool_wgrad is None or not ops.is_cpu(q):
            return None
        if tuple(dy_shape) != self.output_shape(saved.shape):
            return None
        return saved.route.pool_wgrad, saved.xp

    def _backward_pointwise2(self, dy, need_dx, into, act=None):
        """_backward_cpu after a pw2_fwd_cpu forward: dW from pw2_wgrad_cpu's per-chunk sums (added
        in order), dx from pw2_dgrad_cpu, added into `into` where given (and then, with `act`, the
        sum through that activation's gradient in the same pass: backward_into)."""
        (n, c, h, w), x, options = self._saved.shape, self._saved.x, self._saved.route.stride2
        _, oc, oh, ow = dy.shape
        q = dy.queue
        wc = _blocks(q)["PW_WC"]
        chunk, chunks = _image_chunks(n, (c * 4 + oc) * oh * ow, -(-c // wc) * -(-oc // 4), oh * ow // 16)
        part = ops.new(q, (chunks, oc, c))
        ops.launch(q, _FAMILY, "pw2_wgrad_cpu", (-(-c // wc), -(-oc // 4), chunks), (1, 1, 1), n, c, oc, oh, ow, chunk,
                   x, dy, part, options=options)
        self._grads_of_chunks(part, chunks, dy)
        if not need_dx:
            return None
        dx = ops.new(q, (n, c, h, w)) if into is None else into
        ops.launch(q, _FAMILY, "pw2_dgrad_cpu", (n * oh * ow // 16,), (1,), c, oc, oh, ow, dy, self.weight,
                   int(into is not None), dx, *ops.dx_act_args(q, act), options=options + ops.dx_act_options(act))
        return dx.mark_written()

    def _grads_of_chunks(self, part, chunks, dy, sums=None):
        """The weight gradient (+)= a kernel's per-chunk partial sums `part` (chunks, weight.size),
        added in order (sum_chunks_cpu); the bias gradient from the per-image sums `sums` (N * OC)
        where given, else from dy."""
        gw, acc = ops.grad_target(self.weight)
        _sum_chunks(dy.queue, gw.size, chunks, part.mark_written(), gw, int(acc))
        gw.mark_written()
        if sums is not None:
            self._bias_grad_cpu(dy.shape[0], dy.shape[1], sums)
        elif self.bias is not None:
            _channel_sum(dy, self.bias)

    def _backward_phases(self, dy, need_dx, options):
        """_backward_cpu after a "phases" forward (the stride-2 build options `options`) on rows of
        whole WG2_VW-output vectors: dW from per-chunk sums over x as it is (added in order) and dx
        from corrt2_cpu's phases, both reading dy as it is. The per-chunk sums: on AVX2 (the tuning
        table's WG2_OL), wgrad2o_cpu's with output channels in the lanes from dy transposed
        (dy_t8_cpu, which also sums its planes for the bias); on AVX-512, wgrad2_cpu's with
        positions in the lanes."""
        (n, c, h, w), x = self._saved.shape, self._saved.x
        _, oc, oh, ow = dy.shape
        q, blocks = dy.queue, _blocks(dy.queue)
        if blocks["WG2_OL"]:
            cop, P = -(-oc // 16) * 16, oh * ow
            dyt, sums = ops.new(q, (n, P, cop)), ops.new(q, (n * oc,))
            ops.launch(q, _FAMILY, "dy_t8_cpu", (n,), (1,), oc, cop, P, dy, dyt, sums, options=options)
            # a lane's run: 64 or more products (whole rows), then its running total
            chunk, chunks = _image_chunks(n, c * h * w + cop * P, -(-c // 2) * (cop // 16), -(-P // 64))
            part = ops.new(q, (chunks, oc, c * 9))
            ops.launch(q, _FAMILY, "wgrad2o_cpu", (-(-c // 2), cop // 16, chunks), (1, 1, 1), n, c, oc, cop, oh, ow,
                       chunk, x, dyt.mark_written(), part, options=options)
            self._grads_of_chunks(part, chunks, dy, sums.mark_written())
        else:
            vw, wo = _WG2_VW, _WG2_O
            chunk, chunks = _image_chunks(n, c * h * w + oc * oh * ow, c * -(-oc // wo), oh * ow // vw)
            part = ops.new(q, (chunks, oc, c * 9))
            ops.launch(q, _FAMILY, "wgrad2_cpu", (c, -(-oc // wo), chunks), (1, 1, 1), n, c, oc, oh, ow, chunk, x,
                       dy, part, options=options)
            self._grads_of_chunks(part, chunks, dy)
        if not need_dx:
            return None
        return self._corrt2(dy, ops.new(q, (n, c, h, w)), options)

    def _corrt2(self, dy, dx, options):
        """dx of a 3x3 stride-2 padding-1 convolution by corrt2_cpu's phases (the stride-2 build
        options; corrt2p_cpu, two dy rows a work-item, where rows are a multiple of 16 and even in
        number)."""
        n, c = dx.shape[:2]
        _, oc, oh, ow = dy.shape
        if options[:1] == ROWS1 and oh % 2 == 0:
            ops.launch(dy.queue, _FAMILY, "corrt2p_cpu", (n * oh * ow // 32, -(-c // 2)), (1, 1), c, oc, oh, ow, dy,
                       self.weight, dx, options=options)
        else:
            rm = _blocks(dy.queue)["CT2_RM"]
            ops.launch(dy.queue, _FAMILY, "corrt2_cpu", (n * oh * ow // 16, -(-c // rm)), (1, 1), c, oc, oh, ow,
                       dy, self.weight, dx, options=options)
        return dx.mark_written()

    def padded_grad(self, q, dy_shape):
        """(top, left, HD, WD): the zero-bordered planes this conv's CPU backward copies its output
        gradient (of dy_shape) into where every kernel that reads dy can read those (the route the
        forward ran: ConvRoute.takes_dy_planes, after a "rows" forward, and after a stride-1
        "channels" or "winot" one whose weight gradient is winot_wgrad's), so that the layer after
        it can write them instead (Sequential: a BatchNorm2d's backward pass, then
        backward_padded); None otherwise."""
        saved = getattr(self, "_saved", None)
        if not isinstance(saved, _Saved) or not saved.route.takes_dy_planes:
            return None
        if tuple(dy_shape) != self.output_shape(saved.shape):
            return None
        return saved.route.dy_planes

    def _dx_of_planes(self, dyp, r, into=None):
        """dx after a stride-1 "rows", "channels" or "winot" forward from dy's zero-bordered planes
        dyp: the correlation with the flipped weights (conv_winot's, corr_cpu's or corrc_cpu's, as
        the route's data gradient says); added into `into` and that returned where given
        (conv_winot adds it in its stores)."""
        (n, c, h, w), k, q = self._saved.shape, self.kernel_size, dyp.queue
        if r.dgrad == "winot" and into is not None:
            _winot(q, dyp, self.weight, into, 1, r.winot_dx_add, self._zeros(q, c), add=True)
            return into
        dx = ops.new(q, (n, c, h, w))
        if r.dgrad == "winot":
            _winot(q, dyp, self.weight, dx, 1, r.winot_dx, self._zeros(q, c))
        elif r.dgrad == "rows":
            # weight (OC, C, k, k): dx[c] from dy[o], its taps reversed first (_taps_reversed)
            _corr_cpu(q, dyp, _taps_reversed(q, self.weight, k), dx, k * k, c * k * k)
        else:
            _corrc_cpu(q, dyp, self.weight, dx, 1, 1)
        return dx if into is None else ops.add(into, dx, out=into)

    def backward_padded(self, dyp, need_dx=True):
        """backward() (need_dx False: backward_params()) of the output gradient given as the
        zero-bordered planes padded_grad describes."""
        saved = getattr(self, "_saved", None)
        shape = self.output_shape(saved.shape) if isinstance(saved, _Saved) else None
        geometry = self.padded_grad(dyp.queue, shape) if shape else None
        if geometry is None or dyp.shape != shape[:2] + geometry[2:]:
            raise ValueError(f"Conv2d.backward_padded: planes {dyp.shape} are not the {geometry} this conv's "
                             f"backward reads its output gradient {shape} from")
        return self._backward_padded(None, dyp, need_dx, shape, geometry)

    def _backward_padded(self, dy, dyp, need_dx, dy_shape, geometry, into=None, sums=None):
        """The CPU backward that reads dy only as its zero-bordered planes dyp (made here from dy
        where not given): dW = winot_wgrad's (Winograd's adjoint) or wgrad_cpu's correlation of
        them with the forward's padded x (wgrad_cpu: partial sums per chunk of rows, then added in
        order); dx = conv_winot's, corr_cpu's or corrc_cpu's correlation of them with the flipped
        weights (added into `into` where given, and that returned). `sums` (N * K), where the
        writer of dyp gave them: dy's sum per plane, whence the bias gradient (else its own pass)."""
        saved = self._saved
        (n, c, h, w), r, xp = saved.shape, saved.route, saved.xp
        k = self.kernel_size
        q, options = (dyp if dy is None else dy).queue, _cpu_options(k)
        _, oc, oh, ow = dy_shape
        pd, _, hd, wd = geometry
        if dyp is None:
            dyp = ops.new(q, (n, oc, hd, wd))
            sums = ops.new(q, (n * oc,)) if self.bias is not None else None  # the bias gradient's, on the way
            _pad_planes(q, dy, dyp, pd, sums, options)
        gw, acc = ops.grad_target(self.weight)
        if r.wgrad == "winot":
            _winot_wgrad(q, xp, dyp, gw, acc, r.winot, r.winot_wgrad, border=pd)
        else:  # "rows": wgrad_cpu
            blocks, cut = _blocks(q), _cutoffs(q)
            hx, wx, ro = xp.shape[2], xp.shape[3], blocks["RO"][k]
            wgv = (f"-DWGV={blocks['WGV']}",) if blocks["WGV"] != 16 else ()  # 16: the kernel's default
            # chunks of output rows: a chunk's rows of every input channel stay in L2, and the
            # work-items (channels x output blocks x chunks) are enough for every core
            ob, rows = -(-oc // ro), max(1, min(n * oh, cut["wgrad_l2"] // (4 * c * wx)))
            while rows > 1 and c * ob * -(-n * oh // rows) < cut["wgrad_items"]:
                rows = -(-rows // 2)
            chunks = -(-n * oh // rows)
            part = ops.new(q, (chunks, oc, c * k * k))
            ops.launch(q, _FAMILY, "wgrad_cpu", (c, ob, chunks), (1, 1, 1), n, oc, c, oh, ow, hd, wd, pd, hx, wx,
                       rows, dyp, xp, part, options=_cpu_options(k, ro=ro) + wgv)
            _sum_chunks(q, gw.size, chunks, part, gw, int(acc))
            gw.mark_written()
        if sums is not None:
            self._bias_grad_cpu(n, oc, sums)
        elif self.bias is not None:
            _channel_sum(dyp, self.bias)  # the border's zeros add nothing
        return self._dx_of_planes(dyp, r, into) if need_dx else None

    def _bias_grad_cpu(self, n, oc, sums):
        if self.bias is not None:
            gb, acc = ops.grad_target(self.bias)
            _sum_chunks(gb.queue, oc, n, sums, gb, int(acc))  # over the images
            gb.mark_written()

    def _backward_depthwise(self, dy, need_dx):
        saved = self._saved
        x, xp, r = saved.x, saved.xp, saved.route
        n, c, h, w = x.shape
        _, oc, oh, ow = dy.shape
        k, s, p, d = self._geometry()
        q, geometry = dy.queue, (n, c, h, w, oc // c, k, s, p, d, oh, ow)
        gw, acc = ops.grad_target(self.weight)
        if xp is not None:  # (a CPU forward of stride 1 or 2) x bordered and dy's rows whole vectors: no bounds tests
            vw = _row_vector(ow)
            wq = -(-ow // vw) * vw
            dyq = ops.new(q, (n, oc, oh, wq))  # (xp: the forward's, the same vector width and border)
            _pad_planes(q, dy, dyq, 0, None, _cpu_options(k))
            ops.launch(q, _FAMILY, "dw_bwd_weight_cpu", (oc,), (1,), n, oc, oc // c, oh, ow, wq, xp.shape[2],
                       xp.shape[3], xp, dyq, gw, int(acc), options=_cpu_options(k) + (f"-DDWV={vw}", f"-DDWS={s}"))
        elif ops.is_cpu(q):  # a work-item per weight (no work-group of 64 with a barrier per weight)
            ops.launch(q, "conv", "dw_backward_weight_cpu", (oc * k * k,), (1,), *geometry, x, dy, gw, int(acc))
        else:
            ops.launch(q, "conv", "dw_backward_weight", (oc * k * k * _RED,), (_RED,), *geometry, x, dy, gw, int(acc))
        gw.mark_written()
        if self.bias is not None:
            _channel_sum(dy, self.bias)
        if not need_dx:
            return None
        dx = ops.new(q, x.shape)
        if r.dgrad == "depthwise":  # the flipped correlation of bordered dy, in vectors
            vw = _row_vector(w)
            dyp = ops.new(q, (n, oc, h + k - 1, -(-w // vw) * vw + k - 1))
            _pad_planes(q, dy, dyp, k - 1 - p, None, _cpu_options(k))
            planes, items = ops.cpu_rows(n * c, h * w * k * k * (oc // c))
            ops.launch(q, _FAMILY, "dw_bwd_data_cpu", (items,), (1,), n * c, planes, c, oc // c, h, w, dyp.shape[2],
                       dyp.shape[3], dyp, self.weight, dx, options=_cpu_options(k) + (f"-DDWV={vw}",))
        elif r.dgrad == "depthwise_s2":  # each dx row's taps by parity, in vectors
            pairs = -(-w // 2)  # dx's column pairs: a vector of each parity's sums covers 2 * vw columns
            vw = min(8, _row_vector(pairs))
            border, tq = (k - p) // 2, -(-pairs // vw) * vw
            dyb = ops.new(q, (n, oc, border + max(oh, (h - 1 + p) // 2 + 1), border + max(ow, tq + (p + 1) // 2)))
            _pad_planes(q, dy, dyb, border, None, _cpu_options(k))
            planes, items = ops.cpu_rows(n * c, h * w * k * k * (oc // c) // 4)
            ops.launch(q, _FAMILY, "dw_bwd_data_s2_cpu", (items,), (1,), n * c, planes, c, oc // c, h, w, p,
                       dyb.shape[2], dyb.shape[3], dyb, self.weight, dx, options=_cpu_options(k) + (f"-DDWV={vw}",))
        else:
            ops.launch1d(q, "conv", "dw_backward_data", n * c * h, *geometry, dy, self.weight, dx)
        return dx.mark_written()


class ConvTranspose2d(Module):
    # x: (N, C, H, W) -> (N, K, (H-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1, ...);
    # weight (C, K/groups, kH, kW)
    """ConvTranspose2d(in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1, bias=True, dilation=1): the gradient of a convolution as a layer; weight (C, K/groups, kH, kW), PyTorch's semantics; kernel_size, stride, padding, output_padding and dilation each an int or a (height, width) pair."""
    PAIR_ARGS = ("kernel_size", "stride", "padding", "output_padding", "dilation")  # files hold a pair as a list of two

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1):
        super().__init__()
        self.in_channels = positive("in_channels", in_channels)
        self.out_channels = positive("out_channels", out_channels)
        self.kernel_size = int_or_pair("kernel_size", kernel_size, 1)
        self.stride = int_or_pair("stride", stride, 1)
        self.padding = int_or_pair("padding", padding, 0, MAX_PADDING)
        self.output_padding = int_or_pair("output_padding", output_padding, 0, MAX_PADDING)
        self.groups = _check_groups(self.in_channels, self.out_channels, groups)
        self.dilation = int_or_pair("dilation", dilation, 1)
        bias = as_bool("bias", bias)
        if any(op >= max(s, d) for op, s, d in zip(*(pair(a) for a in (self.output_padding, self.stride,
                                                                      self.dilation)))):
            raise ValueError(f"output_padding ({self.output_padding}) must be smaller than either stride "
                             f"({self.stride}) or dilation ({self.dilation}), as PyTorch")
        shapes = self.tensor_shapes(self.in_channels, self.out_channels, self.kernel_size, groups=self.groups,
                                    bias=bias)
        kh, kw = pair(self.kernel_size)
        bound = 1.0 / math.sqrt(self.out_channels // self.groups * kh * kw)  # PyTorch's fan-in of the weight
        self.weight = uniform(bound, shapes["weight"])
        self.bias = uniform(bound, shapes["bias"]) if bias else None
        self._params = {"weight": self.weight, **({"bias": self.bias} if bias else {})}

    @classmethod
    def tensor_shapes(cls, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                      bias=True, dilation=1):
        kh, kw = pair(int_or_pair("kernel_size", kernel_size, 1))
        g = _check_groups(in_channels, out_channels, groups)
        return {"weight": (in_channels, out_channels // g, kh, kw), **({"bias": (out_channels,)} if bias else {})}

    def config(self):
        # groups and dilation only when set: files and ONNX doc strings (which quote the repr) of
        # models without them keep their bytes
        extra = {k: v for k, v in (("groups", self.groups), ("dilation", self.dilation)) if v != 1}
        return {"in_channels": self.in_channels, "out_channels": self.out_channels,
                "kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding,
                "output_padding": self.output_padding, "bias": self.bias is not None, **extra}

    def output_shape(self, shape):
        check_rank("ConvTranspose2d", shape, 4, "(N, C, H, W)")
        n, c, h, w = shape
        if c != self.in_channels:
            raise ValueError(f"ConvTranspose2d expects {self.in_channels} input channels, got shape {tuple(shape)}")
        oh, ow = ((v - 1) * s - 2 * p + d * (k - 1) + op + 1 for v, k, s, p, op, d in
                  zip((h, w), *(pair(a) for a in (self.kernel_size, self.stride, self.padding, self.output_padding,
                                                  self.dilation))))
        if oh < 1 or ow < 1:
            raise ValueError(f"ConvTranspose2d with padding {self.padding} leaves no output for input {h}x{w}")
        return (n, self.out_channels, oh, ow)

    def macs(self, shape):  # each input element meets K/groups x kH x kW weights
        self.output_shape(shape)
        kh, kw = pair(self.kernel_size)
        return int(np.prod(shape)) * (self.out_channels // self.groups) * kh * kw

    @property
    def general(self):
        """Whether kernel, stride, padding or dilation differ between height and width, or groups or
        dilation are set: then the column route (conv_cols' transposed forward and backward), else
        the square one below."""
        return (self.groups != 1 or self.dilation != 1
                or any(isinstance(v, tuple) for v in (self.kernel_size, self.stride, self.padding,
                                                      self.output_padding)))

    def forward(self, x):
        # the data gradient of a Conv2d(K -> C) with this weight: dcols = W^T x, then col2im (+ bias)
        q = self._on(x)
        if self.general:
            out_shape = self.output_shape(x.shape)
            g = conv_cols.transposed(x.shape, out_shape, pair(self.kernel_size), pair(self.stride),
                                     pair(self.padding), pair(self.dilation), self.groups)
            y, rows = conv_cols.transposed_forward(q, x, self.weight, self.bias, g, out_shape)
            self._saved = (x.shape, g, rows)
            return y
        _, oc, oh, ow = self.output_shape(x.shape)
        n, c, h, w = x.shape
        k, s, p = self.kernel_size, self.stride, self.padding
        P, ckk = h * w, oc * k * k
        dcols = ops.gemm(ckk, P, c, self.weight, (1, ckk, 0), x, (P, 1, c * P), ops.new(q, (ckk, n * P)),
                         (n * P, 1, P), batch=n)
        y = ops.new(q, (n, oc, oh, ow))
        _col2im(q, n, oc, oh, ow, k, s, p, 1, h, w, dcols, self.bias, y)
        self._saved = x
        return y

    def backward(self, dy):
        # dx = Conv2d(K -> C) forward of dy: im2col + GEMM; dW = x (C, N*P) @ cols^T
        if isinstance(self._saved, tuple):  # the column route's
            shape, g, rows = self._saved
            dx = conv_cols.transposed_backward(dy.queue, dy, rows, self.weight, g, shape)
            if self.bias is not None:
                _channel_sum(dy, self.bias)
            return dx
        x = self._saved
        n, c, h, w = x.shape
        _, oc, oh, ow = dy.shape
        k, s, p = self.kernel_size, self.stride, self.padding
        q, P, ckk = dy.queue, h * w, oc * k * k
        NP = n * P
        cols = ops.new(q, (ckk, NP))
        _im2col(q, n, oc, oh, ow, k, s, p, 1, h, w, dy, cols)
        xp = ops.permute3(x, (n, c, P), (c * P, P, 1), ops.new(q, (c, NP)), (P, NP, 1))
        gw, acc = ops.grad_target(self.weight)
        ops.gemm(c, ckk, NP, xp, (NP, 1, 0), cols, (1, NP, 0), gw, (ckk, 1, 0), beta=float(acc))
        if self.bias is not None:
            _channel_sum(dy, self.bias)
        dx = ops.new(q, (n, c, h, w))
        ops.gemm(c, P, ckk, self.weight, (ckk, 1, 0), cols, (NP, 1, P), dx, (P, 1, c * P), batch=n)
        return dx
