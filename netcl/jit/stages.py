"""The planner: the stages of a layer list, made without any device, and the kernel family that
runs each. Stages read and write numbered values (0: the plan's input); blocks are walked into:

    Conv2d [+ BatchNorm2d] [+ activation] [+ MaxPool2d(2)]  -> ConvStage   (a conv family; groups=1, dilation=1)
    depthwise Conv2d [+ BatchNorm2d] [+ activation]         -> ConvStage   (the depthwise family; groups=C)
    Conv1d [+ BatchNorm1d] [+ activation], a column-route   -> ColsStage   (im2col, a GEMM per group, one
        Conv2d [+ BatchNorm2d] [+ activation]                  bias + activation kernel; not depthwise Conv1d)
    [LayerNorm +] Linear [+ activation]                     -> LinearStage (the linear family; the LayerNorm's
                                                               weight and bias folded into the Linear's)
    Transpose, Linear [+ activation], the same Transpose    -> LinearStage along the axis the swap brings last
    [LayerNorm +] MultiheadAttention [+ activation]         -> LinearStage (input projection), AttentionStage,
                                                               LinearStage (output projection)
    LayerNorm                                               -> LayerNormStage
    AdaptiveAvgPool2d(1), [Transpose(1, 2) +] AdaptiveAvgPool1d(1) -> MeanStage
    Transpose                                               -> TransposeStage
    MaxPool2d (no conv before it took it), Upsample         -> ResampleStage
    Residual(body, shortcut) [+ activation]                 -> the shortcut's stages, the body's stages, and
        the add (then the activation) in the epilogue of the body's last stage when that is an unpooled
        conv or a Linear; else an AddStage
    Concat(branches)                                        -> ConcatStage (the output's shape), each branch's
        stages, its last stage writing into its slice of the output when it is a conv stage (dim 1),
        else a CopyStage
    Flatten                                                 -> ViewStage   (no kernel)
    Dropout, Identity                                       -> dropped     (identity in eval mode)
    anything else                                           -> LayerStage  (the layer's own forward)

An activation is any layer with an `act` attribute (a netcl.act.Act) and a `slope`, or an ELU, a
Softplus (threshold 20) or a Mish (_act_code). Every value
gets a stored zero border (plan_stages): the widest padding of the convolutions that read it (a
downsampling block's 3x3 and 1x1 read one value), when only convolutions (and residual epilogues)
read it and only conv stages write it; else none.
"""
import numpy as np

from netcl.act import Act
from netcl.convspec import ConvSpec, winot_enabled, winot_layout
from netcl.jit.conv_cpu import ConvCpu, cpu_block
from netcl.jit.conv_dw import ConvDw
from netcl.jit.conv_gpu import ConvGpu
from netcl.jit.conv_wino import ConvWino, ConvWinoT, wino_tile
from netcl.nn.activation import ELU, Mish, Softplus
from netcl.nn.attention import MultiheadAttention
from netcl.nn.basic import Dropout, Flatten, Identity, Transpose
from netcl.nn.conv import Conv2d
from netcl.nn.conv1d import Conv1d
from netcl.nn.linear import Linear
from netcl.nn.norm import BatchNorm1d, BatchNorm2d, LayerNorm
from netcl.nn.pool import AdaptiveAvgPool1d, AdaptiveAvgPool2d, MaxPool2d
from netcl.nn.upsample import Upsample


# Residual and Concat (netcl.nn.blocks, which imports Sequential, which imports this package) are
# recognised by their parts: a body and a shortcut, branches and a dim
def _is_residual(layer):
    return hasattr(layer, "body") and hasattr(layer, "shortcut")


def _is_concat(layer):
    return hasattr(layer, "branches") and hasattr(layer, "dim")


def _act_code(layer):
    """(Act, slope) that the fused kernels apply (kernels/act.h) for activation layer `layer`, or None
    when it is none they take: a layer with an `act` code and its `slope`; ELU (slope: alpha),
    Softplus at its default threshold of 20 (slope: beta) and Mish, whose layers run act_param.cl's
    kernels (inference-only codes: training keeps those layers' own)."""
    act = getattr(layer, "act", None)
    if act is not None:
        return act, float(layer.slope)
    if isinstance(layer, ELU):
        return Act.ELU, layer.alpha
    if isinstance(layer, Softplus) and layer.threshold == 20.0:
        return Act.SOFTPLUS, layer.beta
    if isinstance(layer, Mish):
        return Act.MISH, 0.0
    return None


def _is_act(layer):
    return _act_code(layer) is not None


def _act_slope(layer):
    """(Act, slope) of an activation layer, (None, 0.0) for none."""
    return _act_code(layer) if layer is not None else (None, 0.0)


def _act_name(act):
    return f"act{int(act)}" if act is not None else None


class Stage:
    """What every stage has: the values it reads (src, and res for a residual add) and writes (dst),
    the stored borders of those values (set by plan_stages), and `fused` (a kernel of the plan)."""
    fused = True
    launches = 1  # kernels a fused stage enqueues per call (ColsStage: more)
    sources = ()
    src = dst = res = None
    in_border = out_border = res_border = 0


class ConvStage(Stage):
    """Conv2d, then optionally BatchNorm2d (folded into the weights), an activation, MaxPool2d(2)
    (dense convolutions only), and the residual add with the activation after it (act2)."""

    def __init__(self, conv, bn=None, act=None, pool=None):
        self.conv, self.bn, self.pool = conv, bn, pool
        self.depthwise = conv.groups > 1
        self.act, self.slope = _act_slope(act)
        self.act2, self.slope2 = None, 0.0
        self.sources = [t for lay in (conv, bn) if lay is not None
                        for _, t in lay.named_parameters() + lay.named_buffers()]

    def __str__(self):
        return "+".join(x for x in ("DwConv2d" if self.depthwise else "Conv2d", self.bn and "BatchNorm2d",
                                    _act_name(self.act), self.pool and "MaxPool2d", self.res is not None and "add",
                                    _act_name(self.act2)) if x)

    def spec(self, shape, kt=0, koff=0):
        """The ConvSpec for input `shape` (N, C, H, W; N is not part of it), writing channels koff..
        of a stored output of kt channels (0: its own)."""
        conv = self.conv
        _, c, h, w = shape
        _, k, oh, ow = conv.output_shape(shape)
        return ConvSpec(c=c, h=h, w=w, k=k, ks=conv.kernel_size, stride=conv.stride, pad=conv.pads()[0],
                        oh=oh, ow=ow, pool=self.pool is not None, ipb=self.in_border, opb=self.out_border,
                        act=self.act, slope=self.slope, kt=kt, koff=koff, res=self.res is not None,
                        rpb=self.res_border, act2=self.act2, slope2=self.slope2, dil=conv.dilation,
                        mult=k // c if self.depthwise else 0)

    def folded(self):
        """(weight (K, C/groups, k, k), bias (K,)) with the batch norm folded in, float32."""
        w = self.conv.weight.numpy().astype(np.float64)
        b = (self.conv.bias.numpy().astype(np.float64) if self.conv.bias is not None
             else np.zeros(self.conv.out_channels))
        if self.bn is not None:
            w, b = _fold_bn(w, b, self.bn)
        return w.astype(np.float32), b.astype(np.float32)


def _fold_bn(w, b, bn):
    """(w', b') float64 with BatchNorm `bn` (running statistics) folded in per output channel (w's
    first axis): w' = w gamma / sqrt(var + eps), b' = (b - mean) gamma / sqrt(var + eps) + beta."""
    scale = bn.weight.numpy() / np.sqrt(bn.running_var.numpy().astype(np.float64) + bn.eps)
    w = w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
    return w, (b - bn.running_mean.numpy()) * scale + bn.bias.numpy()


class LinearStage(Stage):
    """[LayerNorm +] Linear, then optionally an activation, and the residual add with the activation
    after it. Also a MultiheadAttention's projections (weights in PyTorch's (out, in) layout), and a
    Linear between two equal Transposes (`swap`): it then runs along the axis the swap brings last.

    weight: (in, out), or (out, in) when `transposed`; ln: a LayerNorm before it (folded: its
    weight scales W's rows, its bias adds b' = beta W)."""

    def __init__(self, weight, bias, act=None, transposed=False, ln=None, swap=None, label="Linear"):
        self.weight, self.bias, self.transposed, self.ln, self.swap, self.label = \
            weight, bias, transposed, ln, swap, label
        self.out_f, self.in_f = weight.shape if transposed else weight.shape[::-1]
        self.act, self.slope = _act_slope(act)
        self.act2, self.slope2 = None, 0.0
        self.sources = [t for t in (weight, bias) if t is not None]
        if ln is not None:
            self.sources += [t for _, t in ln.named_parameters()]

    @classmethod
    def of(cls, lin, act=None, ln=None, swap=None):
        """The stage of Linear `lin`, with the activation, LayerNorm and Transpose pair it absorbs."""
        return cls(lin.weight, lin.bias, act, ln=ln, swap=swap)

    def __str__(self):
        return "+".join(x for x in (self.ln and "LayerNorm", self.swap and "Transpose", self.label,
                                    _act_name(self.act), self.res is not None and "add",
                                    _act_name(self.act2)) if x)

    def axis_of(self, shape):
        """The axis of `shape` the Linear runs along: the last, or with a swap the axis the swap
        brings last (the two Transposes restore the order of the others)."""
        last = len(shape) - 1
        if self.swap is None:
            return last
        lo, hi = self.swap.dims(shape)
        return lo if hi == last else last

    def inner(self, shape):
        """Elements between one input feature and the next (1 along the last axis)."""
        return int(np.prod(shape[self.axis_of(shape) + 1:], dtype=np.int64))

    def folded(self):
        """(weight (in, out), bias (out,)) with the LayerNorm's weight and bias folded in, float32
        (zeros for a missing bias)."""
        w = self.weight.numpy()
        w = w.T if self.transposed else w
        b = self.bias.numpy() if self.bias is not None else np.zeros(self.out_f, np.float32)
        if self.ln is not None:
            gamma = self.ln.weight.numpy().astype(np.float64)
            b = self.ln.bias.numpy().astype(np.float64) @ w.astype(np.float64) + b
            w = gamma[:, None] * w
        return np.ascontiguousarray(w, np.float32), np.asarray(b, np.float32)


class LayerNormStage(Stage):
    """A LayerNorm that no Linear follows."""

    def __init__(self, ln):
        self.ln = ln
        self.sources = [t for _, t in ln.named_parameters()]

    def __str__(self):
        return "LayerNorm"

    def folded(self):
        """(weight, bias) of the LayerNorm, as the kernel reads them."""
        return self.ln.weight.numpy(), self.ln.bias.numpy()


class AttentionStage(Stage):
    """The attention core of a MultiheadAttention: reads its input projection's (N, L, 3E) output."""

    def __init__(self, mha):
        self.mha = mha

    def __str__(self):
        return "Attention"


class MeanStage(Stage):
    """AdaptiveAvgPool2d(1) or AdaptiveAvgPool1d(1), the latter optionally after Transpose(1, 2)
    (then the mean over the tokens of (N, L, E), read in place)."""

    def __init__(self, pool, swapped=False):
        self.pool, self.swapped = pool, swapped

    def __str__(self):
        return ("Transpose+" if self.swapped else "") + type(self.pool).__name__

    def split(self, shape):
        """(outer, R, inner): the input read as (outer, R, inner), averaged over R."""
        if self.swapped:
            return shape[0], shape[1], shape[2]
        return shape[0] * shape[1], int(np.prod(shape[2:], dtype=np.int64)), 1

    def output_shape(self, shape):
        """The pooled shape for input `shape` (the mean over tokens of a swapped (N, L, E) input)."""
        if self.swapped:
            shape = (shape[0], shape[2], shape[1])
        return self.pool.output_shape(shape)


class ResampleStage(Stage):
    """A MaxPool2d that no convolution took, or an Upsample: one kernel, a work-item per output row."""

    def __init__(self, layer):
        self.layer = layer

    def __str__(self):
        return type(self.layer).__name__


class TransposeStage(Stage):
    """A Transpose no Linear or mean absorbed: one copy kernel."""

    def __init__(self, layer):
        self.layer = layer

    def __str__(self):
        return "Transpose"


class AddStage(Stage):
    """dst = act(src + res): a residual add that no kernel epilogue took."""

    def __init__(self, act=None):
        self.act, self.slope = _act_slope(act)

    def __str__(self):
        return "+".join(x for x in ("Add", _act_name(self.act)) if x)


class CopyStage(Stage):
    """A Concat branch's tensor (src) copied into its slice of the output (dst) along `dim`."""

    def __init__(self, dim):
        self.dim = dim

    def __str__(self):
        return "CopySlice"


class ConcatStage(Stage):
    """No kernel: names the Concat whose output is dst and its branches' last stages (writers),
    whose slices the executable works out per input shape."""
    fused = False

    def __init__(self, layer):
        self.layer, self.writers = layer, []

    def __str__(self):
        return "Concat"


class ViewStage(Stage):
    """Flatten: dst is src's buffer, reshaped."""
    fused = False

    def __init__(self, layer):
        self.layer = layer

    def __str__(self):
        return type(self.layer).__name__


class LayerStage(Stage):
    """Not fused: the layer's own forward (it allocates per call)."""
    fused = False

    def __init__(self, layer):
        self.layer = layer

    def __str__(self):
        return type(self.layer).__name__


class ColsStage(LayerStage):
    """A Conv1d (not depthwise: those run conv1d.cl's direct kernel) or a Conv2d of the column route
    (conv.general), then optionally its BatchNorm (folded into the weights) and an activation: the
    column route with the folded weights, bias and activation in one epilogue kernel (netcl.jit.cols).
    It runs as its layer would, per call through netcl.ops (im2col and the GEMM are the layer's own
    kernels); `layer` is the conv, whose output shape is the stage's."""
    fused = True

    def __init__(self, conv, bn=None, act=None):
        self.layer, self.bn = conv, bn
        self.act, self.slope = _act_slope(act)
        self.sources = [t for lay in (conv, bn) if lay is not None
                        for _, t in lay.named_parameters() + lay.named_buffers()]

    def __str__(self):
        return "+".join(x for x in (type(self.layer).__name__, self.bn and type(self.bn).__name__,
                                    _act_name(self.act)) if x)

    @property
    def launches(self):
        """Kernels per call: im2col, a GEMM per group (a split-K GEMM's reduction not counted), the epilogue."""
        return self.layer.groups + 2

    def cols(self, shape):
        """The column route's geometry (netcl.nn.conv_cols.Cols) at input `shape`."""
        conv = self.layer
        return conv._cols(conv._geometry(shape)) if isinstance(conv, Conv1d) else conv._cols(shape)

    def folded(self):
        """(weight, bias (K,)) with the batch norm folded in, float32 (zeros for a missing bias)."""
        conv = self.layer
        w = conv.weight.numpy().astype(np.float64)
        b = conv.bias.numpy().astype(np.float64) if conv.bias is not None else np.zeros(conv.out_channels)
        if self.bn is not None:
            w, b = _fold_bn(w, b, self.bn)
        return w.astype(np.float32), b.astype(np.float32)


def _fusable_conv(conv):
    if conv.general:  # the column route (geometry unlike along height and width, or "same"): a ColsStage
        return False
    if conv.groups == 1:
        return conv.dilation == 1  # the dense families' geometry
    return conv.groups == conv.in_channels  # depthwise (any channel multiplier, stride, dilation)


def _cols_conv(layer):
    """The BatchNorm type that folds into `layer` when it is a conv of the column route (ColsStage), else None."""
    if isinstance(layer, Conv1d):
        return None if layer._direct() else BatchNorm1d
    if isinstance(layer, Conv2d) and layer.general:
        return BatchNorm2d
    return None


def _same_swap(a, b):
    """b is a Transpose of the same two dimensions as Transpose a (their swaps cancel)."""
    return isinstance(b, Transpose) and {a.dim0, a.dim1} == {b.dim0, b.dim1}


def _swaps_last_two(t):
    """Transpose t swaps dimensions 1 and 2 of the rank-3 input an AdaptiveAvgPool1d takes."""
    return {t.dim0 % 3, t.dim1 % 3} == {1, 2} if -3 <= min(t.dim0, t.dim1) and max(t.dim0, t.dim1) < 3 else False


def _global_pool(layer, kind):
    return isinstance(layer, kind) and layer.output_size == 1


def _layers(module):
    return [layer for _, layer in module.chain()]


class _Planner:
    def __init__(self):
        self.stages, self.nvalues = [], 1

    def emit(self, stage, src, res=None, dst=None):
        stage.src, stage.res = src, res
        if dst is None:
            dst, self.nvalues = self.nvalues, self.nvalues + 1
        stage.dst = dst
        self.stages.append(stage)
        return dst

    def block_tail(self, start, v):
        """The last stage emitted since `start` when it alone wrote v (the block's result; a Concat's
        output has a writer per branch), else None."""
        last = self.stages[-1] if len(self.stages) > start else None
        if last is None or last.dst != v or sum(st.dst == v for st in self.stages) > 1:
            return None
        return last

    def walk(self, layers, v):
        """Emit the stages of `layers` applied to value v; returns the value of the result."""
        layers = [x for x in layers if not isinstance(x, (Dropout, Identity))]  # the identity in eval mode
        i = 0
        while i < len(layers):
            lay = layers[i]
            nxt = lambda j: layers[i + j] if i + j < len(layers) else None  # noqa: E731
            act_at = lambda j: (nxt(j), 1) if _is_act(nxt(j)) else (None, 0)  # noqa: E731  an optional activation
            if isinstance(lay, Conv2d) and _fusable_conv(lay):
                j, bn, pool = 1, None, None
                if isinstance(nxt(j), BatchNorm2d) and nxt(j).num_features == lay.out_channels:
                    bn, j = nxt(j), j + 1
                act, a = act_at(j)
                j += a
                p = nxt(j)
                if (lay.groups == 1 and isinstance(p, MaxPool2d) and p.kernel_size == 2 and p.stride == 2
                        and p.padding == 0 and not p.ceil_mode):
                    pool, j = p, j + 1
                v = self.emit(ConvStage(lay, bn, act, pool), v)
                i += j
            elif _cols_conv(lay) is not None:
                bn, j = nxt(1), 2  # its exact type: a BatchNorm1d is a BatchNorm2d
                if type(bn) is not _cols_conv(lay) or bn.num_features != lay.out_channels:
                    bn, j = None, 1
                act, a = act_at(j)
                v = self.emit(ColsStage(lay, bn, act), v)
                i += j + a
            elif isinstance(lay, Linear):
                act, a = act_at(1)
                v = self.emit(LinearStage.of(lay, act), v)
                i += 1 + a
            elif isinstance(lay, LayerNorm) and isinstance(nxt(1), Linear):
                act, a = act_at(2)
                v = self.emit(LinearStage.of(nxt(1), act, ln=lay), v)
                i += 2 + a
            elif isinstance(lay, LayerNorm) and isinstance(nxt(1), MultiheadAttention):
                act, a = act_at(2)
                v = self.attention(nxt(1), v, lay, act)
                i += 2 + a
            elif isinstance(lay, MultiheadAttention):
                act, a = act_at(1)
                v = self.attention(lay, v, act=act)
                i += 1 + a
            elif isinstance(lay, LayerNorm):
                v = self.emit(LayerNormStage(lay), v)
                i += 1
            elif isinstance(lay, Transpose) and isinstance(nxt(1), Linear) and _same_swap(lay, nxt(2 + act_at(2)[1])):
                act, a = act_at(2)
                v = self.emit(LinearStage.of(nxt(1), act, swap=lay), v)
                i += 3 + a
            elif isinstance(lay, Transpose) and _global_pool(nxt(1), AdaptiveAvgPool1d) and _swaps_last_two(lay):
                v = self.emit(MeanStage(nxt(1), swapped=True), v)
                i += 2
            elif _global_pool(lay, AdaptiveAvgPool1d) or _global_pool(lay, AdaptiveAvgPool2d):
                v = self.emit(MeanStage(lay), v)
                i += 1
            elif isinstance(lay, Transpose):
                v = self.emit(TransposeStage(lay), v)
                i += 1
            elif isinstance(lay, Upsample) or (isinstance(lay, MaxPool2d) and not lay.general):
                v = self.emit(ResampleStage(lay), v)
                i += 1
            elif _is_residual(lay):
                act, a = act_at(1)
                v = self.residual(lay, v, act)
                i += 1 + a
            elif _is_concat(lay):
                v = self.concat(lay, v)
                i += 1
            else:
                v = self.emit((ViewStage if isinstance(lay, Flatten) else LayerStage)(lay), v)
                i += 1
        return v

    def attention(self, mha, v, ln=None, act=None):
        """A MultiheadAttention (after a LayerNorm, before an activation): input projection, attention
        core, output projection."""
        v = self.emit(LinearStage(mha.in_proj_weight, mha.in_proj_bias, transposed=True, ln=ln, label="InProj"), v)
        v = self.emit(AttentionStage(mha), v)
        return self.emit(LinearStage(mha.out_proj_weight, mha.out_proj_bias, act, transposed=True, label="OutProj"), v)

    def residual(self, block, v, act):
        # the shortcut first: its result must exist when the body's last kernel adds it
        sc = self.walk(_layers(block.shortcut), v) if block.shortcut is not None else v
        start = len(self.stages)
        body = self.walk(_layers(block.body), v)
        last = self.block_tail(start, body)
        if isinstance(last, (ConvStage, LinearStage)) and last.res is None and getattr(last, "pool", None) is None:
            last.res, (last.act2, last.slope2) = sc, _act_slope(act)
            return body
        return self.emit(AddStage(act), body, res=sc)

    def concat(self, block, v):
        marker = ConcatStage(block)
        out = self.emit(marker, v)
        for branch in block.branches.layers:
            start = len(self.stages)
            b = self.walk(_layers(branch), v)
            last = self.block_tail(start, b)
            if isinstance(last, ConvStage) and block.dim in (1, -3) and b != v:
                last.dst = out  # the conv writes its channels of the output directly
            else:
                last = CopyStage(block.dim)
                self.emit(last, b, dst=out)
            marker.writers.append(last)
        return out


def _readers_writers(stages, nvalues, output):
    """Per value: how it is read ('conv' with the padding, 'res' by a conv epilogue, or 'other')
    and how it is written ('conv' or 'other')."""
    readers, writers = [[] for _ in range(nvalues)], [[] for _ in range(nvalues)]
    writers[0].append("other")
    readers[output].append("other")
    for st in stages:
        if isinstance(st, ConcatStage):
            continue
        readers[st.src].append(("conv", st.conv.pads()[0]) if isinstance(st, ConvStage) else "other")
        if st.res is not None:
            readers[st.res].append("res" if isinstance(st, ConvStage) else "other")
        writers[st.dst].append("conv" if isinstance(st, ConvStage) else "other")
    return readers, writers


def plan_stages(layers):
    """(stages of `layers` in order, the value of the result); every stage's borders set."""
    p = _Planner()
    output = p.walk(layers, 0)
    readers, writers = _readers_writers(p.stages, p.nvalues, output)
    border = [0] * p.nvalues
    for v in range(p.nvalues):
        pads = [r[1] for r in readers[v] if isinstance(r, tuple)]
        if writers[v] and all(w == "conv" for w in writers[v]) and "other" not in readers[v] and pads:
            border[v] = max(pads)  # a reader with less padding starts inside the border
    for st in p.stages:
        st.in_border, st.out_border = border[st.src], border[st.dst]
        st.res_border = border[st.res] if st.res is not None else 0
    return p.stages, output


def conv_family(spec, target, n, depthwise=False):
    """(family, tile) that runs a conv stage at `spec` and batch `n` on `target`
    (netcl.jit.common.Target): for depthwise convolutions the CPU direct kernel (depthwise mode)
    where it fits, else the depthwise family; the GPU family on
    GPUs; on the CPU the tile-lane Winograd (ConvWinoT) for 3x3 stride 1 padding 1 with a bordered
    input where its vectors tile the output (on AVX-512-class devices, config.cpu_winot), else
    Winograd (tile 2 or 4) for 3x3 stride 1, else the direct vector kernel where the shape suits
    it, else the GPU family's kernel with CPU tiles. tile is 0 for the non-Winograd families."""
    if depthwise:  # the CPU direct kernel where its vectors fit, else one work-item per output
        if not target.gpu and spec.dil == 1 and cpu_block(spec, target.config) is not None:
            return ConvCpu, 0
        return ConvDw, 0
    if target.gpu:
        return ConvGpu, 0
    choice = target.config.cpu_winot
    if choice is None and target.config.cpu_wino is not None:
        choice = False  # NETCL_CPU_WINO forces the other families
    if winot_enabled(choice, target.vector_width) and winot_layout(spec) is not None:
        return ConvWinoT, 0
    block = cpu_block(spec, target.config)
    tile = wino_tile(spec, target.config, n, block[0] if block else 0, target.vector_width)
    if tile:
        return ConvWino, tile
    if block is not None:
        return ConvCpu, 0
    return ConvGpu, 0


def conv_families(spec, target, depthwise=False):
    """Every (family, tile) conv_family picks for some batch size: built together, so that a new
    batch size builds nothing (only the Winograd tile moves with the batch, across one threshold)."""
    return sorted({conv_family(spec, target, n, depthwise) for n in (1, 1 << 30)},
                  key=lambda ft: (ft[0].__name__, ft[1]))


def make_conv(target, spec, family_tile):
    """The conv family's launch for `spec` from a (family, tile) of conv_families."""
    family, tile = family_tile
    return family(target, spec, tile) if tile else family(target, spec)
