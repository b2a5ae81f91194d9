"""Blocks that hold layers: Residual (y = body(x) + shortcut(x)) and Concat (branches side by
side, concatenated). A block is one layer of its Sequential (chain() yields it as one step); its
children's state_dict keys follow PyTorch's attribute paths ("3.body.0.weight",
"3.branches.1.0.weight"). Shape errors name the failing layer's path (module.ShapeError)."""
import numpy as np

from netcl import functions, ops
from netcl.nn.conv import Conv2d
from netcl.nn.module import (LayerList, Module, ShapeError, as_int, block_repr, child_shape, declared_problem,
                             declared_tensors, make_declared)
from netcl.nn.norm import _act_options
from netcl.nn.sequential import Sequential


class Residual(Module):
    # x -> body(x) + x, or body(x) + shortcut(x); body = Sequential(*layers)
    """Residual(*layers, shortcut=None): y = body(x) + x, or body(x) + shortcut(x); body = Sequential(*layers)."""
    CALL_STATE = ("_act", "_act_applied")
    takes_act = True  # Sequential's training path on CPUs may hand it the activation after it
    def __init__(self, *layers, shortcut=None):
        super().__init__()
        self.body = Sequential(*layers)
        if shortcut is not None and not isinstance(shortcut, Module):
            raise TypeError(f"Residual's shortcut must be a netcl.nn layer or None, got {type(shortcut).__name__}")
        self.shortcut = shortcut  # kept as given (a layer or a Sequential): its keys are "shortcut.<...>"
        # the activation after the block its sum ran (an ops.ActGrad) and whether the layer after the
        # block took its gradient (Sequential.backward); set by each forward
        self._act, self._act_applied = None, False

    def named_children(self):
        return [("body", self.body)] + ([("shortcut", self.shortcut)] if self.shortcut is not None else [])

    @classmethod
    def from_config(cls, config, children):
        if config or not isinstance(children.get("body"), Sequential) or set(children) - {"body", "shortcut"}:
            raise ValueError(f"Residual takes no config and children 'body' (a Sequential) and optionally "
                             f"'shortcut', got config {config} and children {list(children)}")
        return cls(*children["body"].layers, shortcut=children.get("shortcut"))

    def __repr__(self):
        return block_repr("Residual", self.named_children())

    def output_shape(self, shape):
        y = child_shape("body", self.body, shape)
        s = tuple(shape) if self.shortcut is None else child_shape("shortcut", self.shortcut, shape)
        if y != s and self.shortcut is None:
            raise ShapeError("", "Residual", f"the body maps {tuple(shape)} to {y}, but y = body(x) + x needs the "
                             "input's shape: give the block a shortcut that maps x to the body's output shape "
                             "(e.g. a 1x1 Conv2d with the body's stride)")
        if y != s:
            raise ShapeError("", "Residual", f"the body gives {y} but the shortcut gives {s} for input "
                             f"{tuple(shape)}; y = body(x) + shortcut(x) needs both the same")
        return y

    def macs(self, shape):
        self.output_shape(shape)
        return self.body.macs(shape) + (self.shortcut.macs(shape) if self.shortcut is not None else 0)

    def forward(self, x, act=None):
        """body(x) + shortcut(x); with `act`, the activation layer after the block (on a CPU, an
        activation whose gradient its output gives: Act.grads_from_output), applied in the sum's pass
        and differentiated in backward (Sequential's training path: a pass less)."""
        q = self._on(x)
        if not self.records_as_one():  # it holds a module with a forward of its own: tensor ops, recorded
            return self.body(x) + (x if self.shortcut is None else self.shortcut(x))
        self.output_shape(x.shape)  # a shape error names its layer before any work is done
        self._act, self._act_applied = None, False
        if act is not None and not (ops.is_cpu(q) and act.act.grads_from_output):
            raise ValueError(f"Residual runs an activation in its sum on CPUs only, and one whose gradient its "
                             f"output gives (ReLU, Sigmoid, Tanh), got {act!r}")
        if act is not None and (out := self._bn_sum(x, act)) is not None:
            return out
        y = self.body(x)
        s = x if self.shortcut is None else self.shortcut(x)
        if act is None:
            return ops.add(y, s)
        out = ops.new(q, y.shape)
        chunk, items = ops.cpu_chunk(y.size)
        ops.launch(q, "act_cpu", "add_act_cpu", (items,), (1,), y.size, chunk, float(act.slope), y, s, out,
                   options=(f"-DACT_KIND={int(act.act)}",))
        self._act = ops.ActGrad(act.act, float(act.slope), out)
        return out.mark_written()

    def padded_input(self, q, shape):
        """(top, left, HP, WP): the zero-bordered planes that this block's training forward on a CPU
        can take its input `shape` as (forward_padded), where it has no shortcut and its body
        begins with a Conv2d that copies its input into such planes (Conv2d.padded_input) and whose
        sum applies the body's last BatchNorm2d (Sequential.trains_statistics_tail: the sum,
        bn_add_act_cpu, then reads the identity from the planes too): then Sequential's training
        path has the BatchNorm2d before the block write them, and no pad_planes_cpu copy is made.
        None otherwise."""
        layers = self.body.layers
        if (self.shortcut is not None or len(layers) < 2 or type(layers[0]) is not Conv2d
                or not (self.training and self.body.trains_statistics_tail(q))):
            return None
        return layers[0].padded_input(q, shape)

    def forward_padded(self, xp, shape, act):
        """forward(x, act) of an input of `shape` given as the zero-bordered planes xp that
        padded_input describes (the BatchNorm2d before this block wrote them): the body's first
        conv reads them as they are, and the sum (with the activation layer `act` after the block,
        as forward's) reads the identity from them."""
        q = self._on(xp)
        self.output_shape(shape)
        geometry = self.padded_input(q, shape)
        if geometry is None or xp.shape != tuple(shape[:2]) + tuple(geometry[2:]):
            raise ValueError(f"Residual.forward_padded: planes {xp.shape} are not the {geometry} this block takes "
                             f"input {tuple(shape)} as")
        if act is None or not act.act.grads_from_output:
            raise ValueError(f"Residual.forward_padded runs the activation after the block in its sum: one whose "
                             f"gradient its output gives (ReLU, Sigmoid, Tanh), got {act!r}")
        self._act, self._act_applied = None, False
        out = self._bn_sum(None, act, padded=(xp, tuple(shape), geometry))
        if out is None:  # padded_input asked trains_statistics_tail, as statistics_tail does: not reached
            raise RuntimeError("Residual.forward_padded: the body's statistics pass did not run")
        return out

    def _bn_sum(self, x, act, padded=None):
        """The sum's pass (with the activation `act`) that also applies the body's last BatchNorm2d,
        and the shortcut's where it is a Sequential ending in one (norm_cpu.cl's bn_add_act_cpu:
        their element-wise passes and outputs go); None, and nothing run, where the body does not
        end in a BatchNorm2d (Sequential.statistics_tail). `padded` (xp, shape, geometry): the
        input as forward_padded's planes (x None; no shortcut), the identity read from them."""
        body = self.body.statistics_tail(x, padded[:2] if padded else None)
        if body is None:
            return None
        tail = self.shortcut.statistics_tail(x) if isinstance(self.shortcut, Sequential) else None
        s = (x if self.shortcut is None else self.shortcut(x)) if tail is None else tail[0]
        options, planes = _act_options(act.act), (0, 0, 0, 0, 0)
        if padded is not None:  # the planes' geometry as arguments: a new input size builds nothing
            (top, left, hp, wp), s = padded[2], padded[0]
            options, planes = options + ("-DS_BORDER=1",), (top, left, hp, wp, padded[1][3])
        q, (n, c, h, w) = body[0].queue, body[0].shape  # the shapes: checked by forward's output_shape
        out = ops.new(q, body[0].shape)
        chunk, items = ops.cpu_chunk(out.size)
        if tail is None:  # no BatchNorm2d on the shortcut: its arguments unused
            d = ops.dummy(q)
            shortcut_bn = (d, d, d, d, 0.0, d, 0, 0, d, d, 0.0)
        else:
            shortcut_bn = tail[1:]
        ops.launch(q, "norm_cpu", "bn_add_act_cpu", (items,), (1,), out.size, chunk, c, h * w, float(act.slope),
                   *body, s, int(tail is not None), *shortcut_bn, out, *planes, options=options)
        for seq in (self.body, self.shortcut if tail is not None else None):
            if seq is not None:
                seq.layers[-1].written_by_pass()
        self._act = ops.ActGrad(act.act, float(act.slope), out)
        return out.mark_written()

    def backward(self, dy):
        return self.backward_act(dy, None)

    def backward_act(self, dy, act):
        """backward(dy), and with `act` (an ops.ActGrad: the activation whose output is this block's
        input, a Residual's before this one that ran it in its sum; Sequential's training path) dx
        through that activation's gradient: in the shortcut's pass that finishes dx where it can
        (Conv2d.backward_into's pw2_dgrad_cpu), else act_bwd_cpu.
        Where the layer after this block took this block's own activation into its dx
        (Sequential.backward: _act_applied), dy arrives through it already."""
        applied, self._act_applied = self._act_applied, False
        if self._act is not None:  # the fused activation's gradient first
            if not applied:
                dy = ops.through_act(dy, self._act)
            if self.shortcut is None:  # dy is this block's own: the body's input gradient is added into it
                # (by its first layer, whose backward runs last)
                return ops.through_act(self.body.backward(dy, into=dy), act)
        dx = self.body.backward(dy)
        if self.shortcut is None:
            return ops.through_act(ops.add(dx, dy), act)
        if dx.buf.int_ptr == dy.buf.int_ptr:  # a body that passes dy through (Identity): not written into
            return ops.through_act(ops.add(dx, self.shortcut.backward(dy)), act)
        if hasattr(self.shortcut, "backward_into"):  # the shortcut's gradient added into the body's
            return self.shortcut.backward_into(dy, dx, act=act)
        return ops.through_act(ops.add(dx, self.shortcut.backward(dy), out=dx), act)


class ModuleList(LayerList):
    """Layers held in a list, keyed "<i>.<...>" like torch.nn.ModuleList (Concat's branches, a
    model's blocks): ModuleList(iterable) or ModuleList(*layers). It is not applied to an input
    itself: the module that holds it applies its layers."""

    HOLDS_ONLY = True

    def __init__(self, *layers):
        if len(layers) == 1 and not isinstance(layers[0], Module):
            try:
                layers = tuple(layers[0])
            except TypeError:
                raise TypeError(f"ModuleList takes netcl.nn layers or an iterable of them, got "
                                f"{type(layers[0]).__name__}") from None
        super().__init__(*layers)

    def __getitem__(self, i):
        return ModuleList(self.layers[i]) if isinstance(i, slice) else self.layers[i]

    def __setitem__(self, i, layer):
        self.layers[i] = _layer(layer, type(self).__name__)

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def append(self, layer):
        """Add a layer at the end; returns the list."""
        self.layers.append(_layer(layer, type(self).__name__))
        return self

    def extend(self, layers):
        """Add the layers of an iterable at the end; returns the list."""
        for layer in layers:
            self.append(layer)
        return self

    def insert(self, index, layer):
        """Insert a layer before position `index`."""
        self.layers.insert(index, _layer(layer, type(self).__name__))

    def output_shape(self, shape):
        raise ValueError("a ModuleList holds layers and is not applied to an input (use Sequential for layers "
                         "applied in order, Concat for branches)")

    def forward(self, x):
        self.output_shape(x.shape)


def _layer(layer, holder):
    if not isinstance(layer, Module):
        raise TypeError(f"{holder} holds netcl.nn layers, got {type(layer).__name__}")
    return layer


class ModuleDict(Module):
    """Layers held by name, as torch.nn.ModuleDict(mapping); keys are state_dict path parts. In a
    traced graph it also holds the parameters a model kept at that path (`tensors`, declared by
    shape: a file's data loads into them)."""

    HOLDS_ONLY = True

    def __init__(self, modules=None, tensors=None):
        super().__init__()
        for name, layer in dict(modules or {}).items():
            self[name] = layer
        make_declared(self, tensors)

    def config(self):
        own = declared_tensors(self)
        return {"tensors": own} if own else {}

    @classmethod
    def tensor_shapes(cls, modules=None, tensors=None):
        return {name: tuple(d["shape"]) for name, d in (tensors or {}).items()}

    @classmethod
    def config_problem(cls, config):
        """What is wrong with a file's config for this class, or None."""
        if not isinstance(config, dict) or set(config) - {"tensors"}:
            return "must be an object with at most the field 'tensors'"
        return declared_problem(config.get("tensors"))

    @classmethod
    def from_config(cls, config, children):
        return cls(children, config.get("tensors"))

    def __setitem__(self, name, layer):
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"ModuleDict keys are non-empty strings without '.', got {name!r}")
        self.add_module(name, _layer(layer, "ModuleDict"))

    def __getitem__(self, name):
        return self._modules[name]

    def __delitem__(self, name):
        delattr(self, name)

    def __contains__(self, name):
        return name in self._modules

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        """The names, in insertion order."""
        return self._modules.keys()

    def values(self):
        """The layers, in insertion order."""
        return self._modules.values()

    def items(self):
        """(name, layer) pairs in insertion order."""
        return self._modules.items()

    def update(self, modules):
        """Add (or replace) the layers of a mapping."""
        for name, layer in dict(modules).items():
            self[name] = layer

    def output_shape(self, shape):
        raise ValueError("a ModuleDict holds layers and is not applied to an input")

    def forward(self, x):
        """Refused: a ModuleDict holds layers; the module that holds it applies them."""
        self.output_shape(x.shape)

    def __repr__(self):
        return block_repr("ModuleDict", self.named_children())


class Concat(Module):
    # x -> cat([branch(x) for branch in branches], dim); every branch sees the same x
    """Concat(*branches, dim=1): every branch sees the same input; their outputs concatenated along dim."""
    def __init__(self, *branches, dim=1):
        super().__init__()
        if not branches:
            raise ValueError("Concat needs at least one branch")
        self.dim = as_int("dim", dim)
        if self.dim == 0:
            raise ValueError("Concat along the batch dimension (dim=0) is not supported: a layer keeps the batch")
        self.branches = ModuleList(*branches)

    def config(self):
        return {"dim": self.dim}

    def named_children(self):
        return [("branches", self.branches)]

    @classmethod
    def from_config(cls, config, children):
        if list(children) != ["branches"] or not isinstance(children["branches"], ModuleList):
            raise ValueError(f"Concat holds one child 'branches' (a ModuleList), got {list(children)}")
        return cls(*children["branches"].layers, **config)

    def __repr__(self):
        return block_repr("Concat", self.named_children(), f"dim={self.dim}")

    def _axis(self, rank):
        if not -rank < self.dim < rank or self.dim % rank == 0:
            raise ShapeError("", "Concat", f"dim={self.dim} is not a non-batch axis of the branches' "
                             f"{rank}-D outputs")
        return self.dim % rank

    def output_shape(self, shape):
        outs = [child_shape(f"branches.{b}", br, shape) for b, br in enumerate(self.branches.layers)]
        given = ", ".join(f"branch {b} gives {o}" for b, o in enumerate(outs))
        if len({len(o) for o in outs}) > 1:
            raise ShapeError("", "Concat", f"the branches' outputs differ in rank: {given}")
        d = self._axis(len(outs[0]))
        if len({o[:d] + o[d + 1:] for o in outs}) > 1:
            raise ShapeError("", "Concat", f"the branches disagree off the concat axis (dim={self.dim}) for input "
                             f"{tuple(shape)}: {given}")
        return outs[0][:d] + (sum(o[d] for o in outs),) + outs[0][d + 1:]

    def macs(self, shape):
        self.output_shape(shape)
        return sum(br.macs(shape) for br in self.branches.layers)

    def forward(self, x):
        q = self._on(x)
        if not self.records_as_one():  # it holds a module with a forward of its own: tensor ops, recorded
            return functions.cat([branch(x) for branch in self.branches.layers], self.dim)
        out = self.output_shape(x.shape)
        d = self._axis(len(out))
        inner = int(np.prod(out[d + 1:], dtype=np.int64))
        y, offset, shapes = ops.new(q, out), 0, []
        for branch in self.branches.layers:  # each branch writes its slice of y
            yb = branch(x)
            ops.launch1d(q, "blocks", "copy_slice", yb.size, yb.size, yb.shape[d], out[d], offset, inner, 1, yb, y)
            offset += yb.shape[d]
            shapes.append(yb.shape)
        self._saved = (d, inner, shapes)
        return y.mark_written()

    def backward(self, dy):
        d, inner, shapes = self._saved
        dx, offset = None, 0
        for i, (branch, shape) in enumerate(zip(self.branches.layers, shapes)):
            dyb = ops.new(dy, shape)  # the branch's slice of dy
            ops.launch1d(dy.queue, "blocks", "copy_slice", dyb.size, dyb.size, shape[d], dy.shape[d], offset, inner,
                         0, dy, dyb)
            offset += shape[d]
            g = branch.backward(dyb.mark_written())
            # the first sum allocates, later ones add into it (a branch's dx is never written in place)
            dx = g if i == 0 else ops.add(dx, g, out=dx if i > 1 else None)
        return dx
