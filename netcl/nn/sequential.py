"""Sequential: layers applied in order, the model type every part of netcl walks; in eval mode
it prepares the fused inference path (netcl.jit) from its layer list. In training it runs a
BatchNorm2d and the activation right after it as one layer, and on CPUs lets a BatchNorm2d
write the zero-bordered planes a Conv2d next to it reads (TRAIN_FUSE)."""
import os
from contextlib import nullcontext

from netcl import autograd, runtime
from netcl.act import Act
from netcl.jit import plan_fused
from netcl import ops
from netcl.nn.conv import Conv2d
from netcl.nn.module import LayerList, child_shape
from netcl.nn.norm import BatchNorm2d, pools_in_norm
from netcl.runtime import default_queue
from netcl.tensor import FLOAT32, Tensor, _as_float32

# Training fuses a BatchNorm2d with the activation layer right after it in the same layer list:
# the BatchNorm writes act(BatchNorm(x)) in its own pass, its backward differentiates through
# both, and the activation layer is skipped both ways (about a third fewer element-wise passes
# over those tensors). NETCL_TRAIN_FUSE=0 in the environment (or TRAIN_FUSE = False here) runs
# every layer on its own, as calling the layers one by one does. On CPUs a Conv2d whose training
# passes copy their input or output gradient into zero-bordered planes (the direct kernels read
# them without bounds checks: Conv2d.padded_input, padded_grad) gets them from the BatchNorm2d
# beside it instead: its forward pass (+ activation) before the conv, its backward pass after.
TRAIN_FUSE = os.environ.get("NETCL_TRAIN_FUSE", "1") != "0"


def _takes_act(layer, nxt, x):
    """Whether training runs the activation layer `nxt` inside `layer`'s last pass: a block that
    takes one (Residual), on a CPU, for an activation whose output gives its gradient."""
    from_output = isinstance(getattr(nxt, "act", None), Act) and nxt.act.grads_from_output
    return (TRAIN_FUSE and getattr(layer, "takes_act", False) and from_output and hasattr(nxt, "slope")
            and ops.is_cpu(x.queue))


def _padded_input(conv, x):
    """Conv2d.padded_input of `conv` (a layer or None) for input x, or None where not a CPU conv."""
    return conv.padded_input(x.queue, x.shape) if type(conv) is Conv2d and ops.is_cpu(x.queue) else None


def _padded_block(layers, j, x):
    """Residual.padded_input of layers[j] for input x where it is a block that takes the
    activation layer after it (_takes_act) and its input as zero-bordered planes; else None."""
    block = layers[j] if j < len(layers) else None
    if j + 1 >= len(layers) or not (hasattr(block, "forward_padded") and _takes_act(block, layers[j + 1], x)):
        return None
    return block.padded_input(x.queue, x.shape)


def fuses_with_next(layer, nxt):
    """Whether training runs `layer` and the layer `nxt` after it as one BatchNorm2d + activation
    pass: an activation is any layer with an `act` (a netcl.act.Act) and a `slope`, as in netcl.jit."""
    return (TRAIN_FUSE and type(layer) is BatchNorm2d and isinstance(getattr(nxt, "act", None), Act)
            and hasattr(nxt, "slope"))


class Sequential(LayerList):
    """Layers applied in order. The layer list is the single source of truth: training,
    saving and export walk it; the fused inference path (eval mode) is derived from it."""

    CALL_STATE = ("_fused_input", "_out_shape", "_skipped", "_pooled")

    def __init__(self, *layers):
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        super().__init__(*layers)
        self._fused = None
        self._fused_input = None  # the input of a fused forward, which saves nothing for backward
        self._skipped = ()  # indices of the activations the last training forward ran inside their BatchNorm2d
        self._pooled = ()  # indices of the MaxPool2d layers it ran there too (their backward as well)

    def __getitem__(self, i):
        if not isinstance(i, slice):
            return self.layers[i]
        part = Sequential(*self.layers[i])  # shares the layers, each keeping its own mode (not train())
        part.training = self.training
        if not self.training:
            part._try_fuse_layers()
        return part

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def chain(self, prefix=""):
        for name, layer in self.named_children():
            yield from layer.chain(f"{prefix}{name}" if not prefix else f"{prefix}.{name}")

    def train(self, mode=True):
        """Training or eval mode for every layer; eval() prepares the fused inference plan (netcl.jit)."""
        super().train(mode)
        self._fused = None
        if not mode:
            self._try_fuse_layers()
        return self

    def _try_fuse_layers(self):
        """Prepare the fused inference path (netcl.jit) from the layer list; None when nothing fuses.
        The plan holds no device state until its first call, so eval() needs no OpenCL."""
        self._fused = plan_fused(self) if self.knows_shapes() else None

    def output_shape(self, shape):
        for name, layer in self.named_children():
            shape = child_shape(name, layer, shape)
        return tuple(shape)

    def macs(self, shape):
        total = 0
        for name, layer in self.named_children():
            out = child_shape(name, layer, shape)  # a shape that does not fit: the error names the layer
            total += layer.macs(shape)
            shape = out
        return total

    def forward(self, x):
        if not isinstance(x, Tensor):
            raise TypeError(f"Sequential expects a netcl Tensor, got {type(x).__name__}; "
                            "use Tensor.from_host(queue, array)")
        if not self.records_as_one() and (autograd.recording() or not self.knows_shapes()):
            for layer in self.layers:  # a module with a forward of its own: the layers one by one, each
                x = layer(x)  # call recorded by autograd (this Sequential's backward could not follow it)
            return x
        self.output_shape(x.shape)  # a shape that does not fit: the same message, naming the layer, on both paths
        # int indices (an Embedding's) go layer by layer: the plan's buffers hold float32 (predict() hands floats)
        if not self.training and self._fused is not None and x.dtype == FLOAT32:
            self._fused_input = x
            y = self._fused(x)
        else:
            self._fused_input = None
            y = self._run_layers(x, self.training)
        self._out_shape = y.shape
        return y

    def statistics_tail(self, x, padded=None):
        """Training on a CPU (TRAIN_FUSE), where the last layer is a BatchNorm2d: forward through
        the layers before it, then that one's statistics only (BatchNorm2d.statistics), whose
        arguments are returned for the caller's pass to apply it (a Residual's sum); backward
        runs as after forward. None, and nothing run, elsewhere. `padded` (xp, shape): the input
        as the zero-bordered planes the first layer, a Conv2d, reads (x None: its forward_padded)."""
        layers = self.layers
        if not self.trains_statistics_tail(x.queue if padded is None else padded[0].queue):
            return None
        self.output_shape(x.shape if padded is None else padded[1])
        self._fused_input = None
        y = self._run_layers(x, True, end=len(layers) - 1, padded=padded)
        pending = layers[-1].statistics(y, self._stats_for(len(layers) - 1, y))
        self._out_shape = y.shape
        return pending

    def trains_statistics_tail(self, q):
        """Whether statistics_tail runs on queue q: training on a CPU with TRAIN_FUSE, the last layer a
        BatchNorm2d."""
        layers = self.layers
        return bool(self.training and TRAIN_FUSE and layers and type(layers[-1]) is BatchNorm2d and ops.is_cpu(q))

    def _feeds_bn(self, i):
        """Whether layer i + 1 is a BatchNorm2d that trains with TRAIN_FUSE: the Conv2d at i then
        computes its batch statistics' parts where its kernel can (Conv2d.forward's stats)."""
        nxt = self.layers[i + 1] if i + 1 < len(self.layers) else None
        return TRAIN_FUSE and type(nxt) is BatchNorm2d and nxt.training

    def _stats_for(self, i, y):
        """The batch statistics' parts of y that the Conv2d at i - 1 computed with it (its
        output_statistics) for the BatchNorm2d at i, or None."""
        prev = self.layers[i - 1] if i > 0 else None
        return prev.output_statistics(y) if TRAIN_FUSE and type(prev) is Conv2d else None

    def _run_layers(self, y, fuse, end=None, padded=None):
        """The layers in order (those before `end` where given); with `fuse`, a BatchNorm2d and the
        activation after it as one pass. `padded` (xp, shape): y None, the first layer a Conv2d
        given its input as its zero-bordered planes (statistics_tail's)."""
        skipped, pooled, fed = [], [], []
        layers = self.layers if end is None else self.layers[:end]
        if padded is not None:
            xp, shape = padded
            y = layers[0]._forward_padded(xp, shape, layers[0].output_shape(shape), fuse and self._feeds_bn(0))
            fed.append(0)
        for i, layer in enumerate(layers):
            if i in skipped or i in fed:
                continue
            nxt = layers[i + 1] if i + 1 < len(layers) else None
            if fuse and fuses_with_next(layer, nxt):
                pool = layers[i + 2] if i + 2 < len(layers) else None
                stats = self._stats_for(i, y)
                if pool is not None and pools_in_norm(pool, y.queue, y.shape):
                    y = layer.forward(y, act=nxt, pool=pool, stats=stats)  # the pool's forward and backward
                    pooled.append(i + 2)
                else:
                    conv = layers[i + 2] if i + 2 < len(layers) else None
                    pad = _padded_input(conv, y)
                    block_pad = _padded_block(layers, i + 2, y) if pad is None else None
                    if pad is not None:  # the conv's zero-bordered input planes, written by this pass
                        yp = layer.forward(y, act=nxt, pad=pad, stats=stats)  # checked by _padded_input
                        y = conv._forward_padded(yp, y.shape, conv.output_shape(y.shape), self._feeds_bn(i + 2))
                        fed.append(i + 2)
                    elif block_pad is not None:  # a Residual's (its body's first conv's), its activation with it
                        yp = layer.forward(y, act=nxt, pad=block_pad, stats=stats)
                        block, after = layers[i + 2], layers[i + 3]
                        y = block.forward_padded(yp, y.shape, after)
                        after._saved = None
                        fed.append(i + 2)
                        skipped.append(i + 3)
                    else:
                        y = layer.forward(y, act=nxt, stats=stats)
                nxt._saved = None  # its output is the BatchNorm's: no stale input for a backward of its own
                skipped.append(i + 1)
            elif fuse and _takes_act(layer, nxt, y):
                y = layer.forward(y, act=nxt)
                nxt._saved = None
                skipped.append(i + 1)
            elif fuse and type(layer) is Conv2d and self._feeds_bn(i):
                y = layer.forward(y, stats=True)
            elif fuse and type(layer) is BatchNorm2d and (stats := self._stats_for(i, y)) is not None:
                y = layer.forward(y, stats=stats)
            elif i not in pooled:
                y = layer(y)
        self._skipped, self._pooled = tuple(skipped), tuple(pooled)
        return y

    def predict(self, x, queue=None):
        """Inference on a host array: numpy in, numpy out (eval mode uses the fused path's round
        trip: one upload, one read). `queue` defaults to netcl.default_queue()."""
        if self.training:
            raise RuntimeError("predict() runs inference: call model.eval() first")
        x = _as_float32(x)  # real numbers only: TypeError for complex or non-numeric input
        if self._fused is not None:
            return self._fused.infer(x, queue)
        q = queue or default_queue()
        with runtime.serial_lock(q) or nullcontext():  # PoCL's serial device: calls take turns (runtime)
            return self.forward(Tensor.from_host(q, x)).to_host()

    def backward(self, dy, input_grad=True, into=None, act=None):
        """Back-propagate dL/d(output) through every layer; returns dL/d(input). With
        input_grad=False (the input needs no gradient: a training step's data) the layers before
        the first one with parameters are skipped, that one computes its parameters' gradients
        only (Module.backward_params: no data-gradient convolution or GEMM), and it returns None.
        With `into` (a tensor of the input's shape; input_grad), dL/d(input) is added into it and
        it is returned: the first layer adds its own (backward_into, or a CPU Conv2d whose dy planes
        the BatchNorm2d after it wrote: its data-gradient kernel adds into `into`) where it can.
        With `act` (an ops.ActGrad: the activation whose output is this input, a Residual's that ran
        in its sum), dL/d(input) comes back through that activation's gradient (the first layer's
        backward_into takes it where it can, else act_bwd_cpu). A layer after a Residual that ran
        its activation is handed that activation (backward_act) and takes it into the pass that
        finishes its own dx where it can (the Residual's act_bwd_cpu pass then goes), else runs
        that pass itself."""
        if not isinstance(dy, Tensor):
            raise TypeError(f"backward expects the output gradient as a netcl Tensor, got {type(dy).__name__}")
        if getattr(self, "_out_shape", None) is None:
            raise RuntimeError("backward() needs a forward pass first, and runs once per forward (a second "
                               "backward would add every gradient again): call the model again before backward()")
        if dy.shape != self._out_shape:
            raise ValueError(f"backward expects a gradient of the last output's shape {self._out_shape}, "
                             f"got {dy.shape}")
        x, self._fused_input = self._fused_input, None
        if x is not None:  # after a fused (eval) forward: replay the layers so they save what backward needs,
            self._replay_eval(x)  # in eval mode even if train() came since (the forward's statistics)
        first = 0
        if not input_grad:  # the first layer that has parameters: nothing before it needs a gradient
            first = next((i for i, lay in enumerate(self.layers) if i not in self._skipped and lay.parameters()),
                         len(self.layers))
        pool = None  # a MaxPool2d the BatchNorm2d before it ran: its gradient goes through that one's backward
        done = None  # a Conv2d whose backward ran with the BatchNorm2d's after it
        for i in reversed(range(first, len(self.layers))):
            if i in self._skipped or i == done:  # a skipped activation's gradient is its BatchNorm2d's or Residual's
                continue
            layer = self.layers[i]
            if i in self._pooled:
                pool = layer
                continue
            if pool is not None:  # (and the conv before it needs no data gradient: its dW and db in that pass)
                shape = layer._saved[0].shape
                wconv = self._pool_wgrad(i, first, input_grad, dy.queue, shape)
                if wconv is None and (pad := self._padded_grad(i, first, dy.queue, shape)) is not None:
                    done = i - 1  # dx into the conv's zero-bordered dy, with its sums per plane
                    sums = ops.new(dy.queue, (shape[0] * shape[1],)) if self.layers[done].bias is not None else None
                    dyp, pool = layer._backward_pooled(dy, pool, pad=pad, psum=sums), None
                    dy, into = self._conv_from_planes(done, dyp, shape, pad, sums, first, input_grad, into)
                    continue
                dy, pool = layer.backward(dy, pool=pool, wgrad=wconv), None
                done = i - 1 if dy is None else done
            elif i == first and not input_grad:
                layer.backward_params(dy)
            elif i == 0 and into is not None and hasattr(layer, "backward_into"):
                dy, into, act = layer.backward_into(dy, into, act=act), None, None
            elif (pad := self._padded_grad(i, first, dy.queue, dy.shape)) is not None:  # the conv's zero-bordered dy
                done = i - 1
                dy, into = self._conv_from_planes(done, layer.backward(dy, pad=pad), dy.shape, pad, None, first,
                                                  input_grad, into)
            elif (before := self._act_before(i, first)) is not None:
                dy = layer.backward_act(dy, before._act)
                before._act_applied = True  # after the call: a raise leaves the block its own pass
            else:
                dy = layer.backward(dy)
        self._out_shape = None
        if into is not None and input_grad:  # the first layer gave its gradient: the sum here
            dy = ops.add(into, dy, out=into)
        return ops.through_act(dy, act) if input_grad else None

    def _act_before(self, i, first):
        """The block whose activation (its _act) layer i's backward takes into its dx
        (backward_act), where the layer before it, past the activations this training forward ran
        inside their layers, is a block that ran that activation in its sum (a Residual,
        takes_act) and runs in this backward (at or after `first`); the caller then marks it to take
        its dy as already through it (_act_applied). Else None."""
        j = i - 1
        while j in self._skipped:
            j -= 1
        prev = self.layers[j] if j >= first and TRAIN_FUSE else None
        if not (hasattr(self.layers[i], "backward_act") and getattr(prev, "takes_act", False)
                and getattr(prev, "_act", None) is not None):
            return None
        return prev

    def backward_into(self, dy, acc, act=None):
        """acc += backward(dy) (a Residual's shortcut into its body's gradient), then through the
        gradient of `act` where given (backward's); returns acc (or that)."""
        return self.backward(dy, into=acc, act=act)

    def _conv_from_planes(self, j, dyp, shape, pad, sums, first, input_grad, into):
        """(dy before conv j, into) after conv j's backward from the zero-bordered planes dyp of its
        output gradient (of `shape`) that the BatchNorm2d after it wrote (sums: their sums per
        plane, or None); conv j's dx added into `into` where it is the first layer and `into` is
        given (then `into` comes back None)."""
        adds = j == 0 and into is not None and input_grad  # the first layer: its dx added into `into`
        dy = self.layers[j]._backward_padded(None, dyp, input_grad or j > first, shape, pad, into if adds else None,
                                             sums=sums)
        return dy, None if adds else into

    def backward_params(self, dy):
        self.backward(dy, input_grad=False)

    def _padded_grad(self, i, first, q, shape):
        """Conv2d.padded_grad of layer i - 1 for its output gradient of `shape` where layer i is a
        BatchNorm2d (its forward with a pool or without) and i - 1 a CPU Conv2d that runs in this
        backward; else None."""
        if not (TRAIN_FUSE and i - 1 >= first and type(self.layers[i]) is BatchNorm2d and ops.is_cpu(q)):
            return None
        conv = self.layers[i - 1]
        if type(conv) is not Conv2d or i - 1 in self._skipped or i - 1 in self._pooled:
            return None
        return conv.padded_grad(q, shape)

    def _pool_wgrad(self, i, first, input_grad, q, shape):
        """The Conv2d at i - 1 where it is the first layer of a backward without an input gradient
        (a training step's), layer i a BatchNorm2d whose forward ran a pool, and the conv's
        pool_wgrad applies to its output gradient of `shape`: that layer's pass takes the conv's
        weight gradients (then it returns None); else None."""
        if not (TRAIN_FUSE and not input_grad and i - 1 == first and type(self.layers[i]) is BatchNorm2d):
            return None
        conv = self.layers[i - 1]
        if type(conv) is not Conv2d or i - 1 in self._skipped or i - 1 in self._pooled:
            return None
        return conv if conv.pool_wgrad(q, shape) is not None else None

    def _replay_eval(self, x):
        """The layers' forward on x in eval mode (every module's flag set and restored directly:
        train()/eval() would also make or drop the fused plan)."""
        modes, todo = [], [self]
        while todo:
            m = todo.pop()
            modes.append((m, m.training))
            todo += [c for _, c in m.named_children()]
        try:
            for m, _ in modes:
                m.training = False
            self._run_layers(x, False)
        finally:
            for m, mode in modes:
                m.training = mode
