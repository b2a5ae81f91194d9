"""The planner: the stages of a layer list, made without any device, and the kernel family that
runs each.

    Conv2d [+ BatchNorm2d] [+ activation] [+ MaxPool2d(2)]  -> ConvStage   (a conv family; groups=1, dilation=1)
    Linear [+ activation]                                   -> LinearStage (the linear family)
    Flatten                                                 -> ViewStage   (no kernel)
    Dropout, Identity                                       -> dropped     (identity in eval mode)
    anything else                                           -> LayerStage  (the layer's own forward)

An activation is any layer with an `act` attribute (a netcl.act.Act) and a `slope`.
"""
import numpy as np

from netcl.jit.common import ConvSpec
from netcl.jit.conv_cpu import ConvCpu, cpu_block
from netcl.jit.conv_gpu import ConvGpu
from netcl.jit.conv_wino import ConvWino, wino_tile
from netcl.nn.basic import Dropout, Flatten, Identity
from netcl.nn.conv import Conv2d
from netcl.nn.linear import Linear
from netcl.nn.norm import BatchNorm2d
from netcl.nn.pool import MaxPool2d


def _is_act(layer):
    return getattr(layer, "act", None) is not None


def _act_slope(layer):
    """(Act, slope) of an activation layer, (None, 0.0) for none."""
    return (layer.act, float(layer.slope)) if layer is not None else (None, 0.0)


class ConvStage:
    """Conv2d, then optionally BatchNorm2d (folded into the weights), an activation, MaxPool2d(2)."""
    fused = True

    def __init__(self, conv, bn=None, act=None, pool=None):
        self.conv, self.bn, self.pool = conv, bn, pool
        self.act, self.slope = _act_slope(act)
        self.sources = [t for lay in (conv, bn) if lay is not None
                        for _, t in lay.named_parameters() + lay.named_buffers()]

    def __str__(self):
        return "+".join(x for x in ("Conv2d", self.bn and "BatchNorm2d", self.act is not None and f"act{int(self.act)}",
                                    self.pool and "MaxPool2d") if x)

    def spec(self, shape, in_border, out_border):
        """The ConvSpec for input `shape` (N, C, H, W; N is not part of it) stored with `in_border`,
        output stored with `out_border`."""
        conv = self.conv
        _, c, h, w = shape
        _, k, oh, ow = conv.output_shape(shape)
        return ConvSpec(c=c, h=h, w=w, k=k, ks=conv.kernel_size, stride=conv.stride, pad=conv.padding,
                        oh=oh, ow=ow, pool=self.pool is not None, ipb=in_border if in_border == conv.padding else 0,
                        opb=out_border, act=self.act, slope=self.slope)

    def folded(self):
        """(weight (K, C, k, k), bias (K,)) with the batch norm folded in, float32."""
        w = self.conv.weight.numpy().astype(np.float64)
        b = (self.conv.bias.numpy().astype(np.float64) if self.conv.bias is not None
             else np.zeros(self.conv.out_channels))
        if self.bn is not None:
            bn = self.bn
            scale = bn.weight.numpy() / np.sqrt(bn.running_var.numpy().astype(np.float64) + bn.eps)
            w = w * scale[:, None, None, None]
            b = (b - bn.running_mean.numpy()) * scale + bn.bias.numpy()
        return w.astype(np.float32), b.astype(np.float32)


class LinearStage:
    """Linear, then optionally an activation."""
    fused = True

    def __init__(self, lin, act=None):
        self.lin = lin
        self.act, self.slope = _act_slope(act)
        self.sources = [t for _, t in lin.named_parameters()]

    def __str__(self):
        return "Linear" + (f"+act{int(self.act)}" if self.act is not None else "")

    def folded(self):
        """(weight (in, out), bias (out,)), float32 (zeros for a missing bias)."""
        lin = self.lin
        b = lin.bias.numpy() if lin.bias is not None else np.zeros(lin.out_features, np.float32)
        return lin.weight.numpy(), b


class ViewStage:
    """Flatten: the next stage reads the same buffer."""
    fused = False
    sources = ()

    def __init__(self, layer):
        self.layer = layer

    def __str__(self):
        return type(self.layer).__name__


class LayerStage:
    """Not fused: the layer's own forward (it allocates per call)."""
    fused = False
    sources = ()

    def __init__(self, layer):
        self.layer = layer

    def __str__(self):
        return type(self.layer).__name__


def plan_stages(layers):
    """The stages of `layers` in order."""
    out, i = [], 0
    layers = [x for x in layers if not isinstance(x, (Dropout, Identity))]  # the identity in eval mode
    while i < len(layers):
        lay = layers[i]
        nxt = lambda j: layers[i + j] if i + j < len(layers) else None  # noqa: E731
        if isinstance(lay, Conv2d) and lay.groups == 1 and lay.dilation == 1:  # the families' geometry
            j, bn, act, pool = 1, None, None, None
            if isinstance(nxt(j), BatchNorm2d) and nxt(j).num_features == lay.out_channels:
                bn, j = nxt(j), j + 1
            if _is_act(nxt(j)):
                act, j = nxt(j), j + 1
            p = nxt(j)
            if isinstance(p, MaxPool2d) and p.kernel_size == 2 and p.stride == 2 and p.padding == 0:
                pool, j = p, j + 1
            out.append(ConvStage(lay, bn, act, pool))
            i += j
        elif isinstance(lay, Linear):
            act = nxt(1) if _is_act(nxt(1)) else None
            out.append(LinearStage(lay, act))
            i += 2 if act is not None else 1
        elif isinstance(lay, Flatten):
            out.append(ViewStage(lay))
            i += 1
        else:
            out.append(LayerStage(lay))
            i += 1
    return out


def conv_family(spec, target, n):
    """(family, tile) that runs a conv stage at `spec` and batch `n` on `target`
    (netcl.jit.common.Target): the GPU family on GPUs; on the CPU Winograd (tile 2 or 4) for 3x3
    stride 1, else the direct vector kernel where the shape suits it, else the GPU family's kernel
    with CPU tiles. tile is 0 for the non-Winograd families."""
    if target.gpu:
        return ConvGpu, 0
    tile = wino_tile(spec, target.config, n)
    if tile:
        return ConvWino, tile
    if cpu_block(spec, target.config) is not None:
        return ConvCpu, 0
    return ConvGpu, 0


def conv_families(spec, target):
    """Every (family, tile) conv_family picks for some batch size: built together, so that a new
    batch size builds nothing (only the Winograd tile moves with the batch, across one threshold)."""
    return sorted({conv_family(spec, target, n) for n in (1, 1 << 30)}, key=lambda ft: (ft[0].__name__, ft[1]))


def make_conv(target, spec, family_tile):
    family, tile = family_tile
    return family(target, spec, tile) if tile else family(target, spec)
