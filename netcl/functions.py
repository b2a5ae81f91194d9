"""Differentiable tensor operations: Tensor's operators and methods, and netcl.tensor, cat,
stack, zeros, ones, randn, arange. Each runs in OpenCL kernels (netcl.array_ops, and ops'
activation and softmax kernels) and, where an operand requires grad, records a node whose
backward runs in kernels too. Arithmetic is float32 with NumPy's broadcasting rules; an int32
tensor takes part as float32 (exact below 2**24)."""
import builtins
import math
import sys

import numpy as np

from netcl import array_ops, autograd, ops
from netcl.act import Act
from netcl.autograd import Node, attach, needs_record, traced
from netcl.rng import rng
from netcl.runtime import default_queue
from netcl.tensor import FLOAT32, INT32, Tensor, install

_NUMBER = (int, float, np.integer, np.floating, bool, np.bool_)


# -- operands ---------------------------------------------------------------------------------------
def _queue(*xs):
    """The queue of the first operand on a device, else the default one."""
    for x in xs:
        if isinstance(x, Tensor) and x.queue is not None:
            return x.queue
    return default_queue()


def _on(x, q):
    """Tensor operand x on q's device: a host tensor moved there, a tensor of another device refused."""
    if x.queue is None:
        x.to(q)
    elif x.queue is not q and x.queue.context != q.context:
        raise ValueError(f"an operation on tensors of two devices ({x.queue.device.name.strip()} and "
                         f"{q.device.name.strip()}): move one with .to(queue)")
    return x


def _operand(x, q):
    """An operand as a float Tensor on q's device, or a Python float."""
    if isinstance(x, Tensor):
        x = _on(x, q)
        return array_ops.to_float(x) if x.dtype == INT32 else x
    if isinstance(x, _NUMBER):
        return float(x)
    try:
        return Tensor.from_host(q, x)
    except TypeError:
        raise TypeError(f"an operand must be a netcl Tensor, a number or an array, got {type(x).__name__}") from None


def _tensor(x):
    """x as a device Tensor (a host tensor moved to the default device)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"expected a netcl Tensor, got {type(x).__name__}")
    return _on(x, _queue(x))


def _float_tensor(x):
    x = _tensor(x)
    return array_ops.to_float(x) if x.dtype == INT32 else x


def _dim(d, ndim, what="dimension"):
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(d).__name__}")
    if not -builtins.max(ndim, 1) <= d < builtins.max(ndim, 1):
        raise IndexError(f"{what} {d} is out of range for a tensor of {ndim} dimensions")
    return int(d) % builtins.max(ndim, 1)


def _dims(dim, ndim, empty_is_all=False):
    """dim (None, an int or a sequence of ints) as a sorted tuple of distinct non-negative dims; a
    reduction's empty sequence (empty_is_all) is every dimension, as PyTorch's."""
    if dim is None or (empty_is_all and isinstance(dim, (tuple, list)) and not dim):
        return tuple(range(ndim))
    dims = sorted({_dim(d, ndim) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))})
    return tuple(d for d in dims if d < ndim)


# -- shapes of gradients -------------------------------------------------------------------------------
def sum_to(g, shape):
    """g summed over the dimensions that broadcasting added to `shape` (NumPy's rules), as `shape`."""
    if g.shape == tuple(shape):
        return g
    pad = g.ndim - len(shape)
    dims = tuple(range(pad)) + tuple(pad + k for k, n in enumerate(shape) if n == 1 and g.shape[pad + k] != 1)
    return _reduce_raw("sum", g, dims)[0]._view(shape)


def _like(x, shape):
    """A new device tensor of x's dtype and `shape` (a copy of int data stays int)."""
    return ops.new(x, shape) if x.dtype == FLOAT32 else Tensor.empty(x.queue, shape, x.dtype)


def expand_to(g, shape):
    """g broadcast out to `shape` (a copy)."""
    if g.shape == tuple(shape):
        return g
    y = _like(g, shape)
    return array_ops.copy_strided(g, shape, array_ops._broadcast_strides(g.shape, shape), 0, y,
                                  array_ops.contiguous_strides(shape), 0)


# -- element-wise with two operands ---------------------------------------------------------------------
class Binary(Node):
    """a op b; backward reads the tensor operands where the operation's gradient needs them."""

    def __init__(self, op, a, b):
        super().__init__((a, b))
        self.op = op
        self.shapes = tuple(x.shape if isinstance(x, Tensor) else None for x in (a, b))
        self.numbers = tuple(None if isinstance(x, Tensor) else x for x in (a, b))
        if op not in ("add", "sub"):
            self.save(*[x for x in (a, b) if isinstance(x, Tensor)])

    @property
    def name(self):
        """The node\'s name in messages and reprs."""
        return f"{self.op.capitalize()}Backward"

    def backward(self, dy):
        saved = list(self.saved_tensors())
        a, b = (saved.pop(0) if n is None and saved else n for n in self.numbers)
        wa, wb = self.wants
        da = db = None
        if self.op == "add":
            da, db = dy if wa else None, dy if wb else None
        elif self.op == "sub":
            da, db = dy if wa else None, array_ops.unary("neg", dy) if wb else None
        elif self.op == "mul":
            da = array_ops.binary("mul", dy, b) if wa else None
            db = array_ops.binary("mul", dy, a) if wb else None
        elif self.op == "div":
            da = array_ops.binary("div", dy, b) if wa else None
            if wb:  # -dy a / b^2
                db = array_ops.unary("neg", array_ops.binary("mul", array_ops.binary(
                    "div", array_ops.binary("div", dy, b), b), a))
        elif self.op == "pow":  # PyTorch's rules at 0: no gradient where b = 0, nor in b where a = 0 <= b
            if wa:  # dy b a^(b - 1)
                da = array_ops.binary("mul", dy, array_ops.binary("pow_grad_base", b, a))
            if wb:  # dy a^b log(a)
                power = array_ops.binary("pow", a, b)
                db = array_ops.binary("mul", dy, array_ops.binary("pow_grad_exponent", power, a))
        else:  # maximum, minimum: the larger (smaller) operand's; a tie halves it between the two
            first = array_ops.binary("gt" if self.op == "maximum" else "lt", a, b)
            share = array_ops.binary("add", first, array_ops.binary("mul", array_ops.binary("eq", a, b), 0.5))
            da = array_ops.binary("mul", dy, share) if wa else None
            db = array_ops.binary("mul", dy, array_ops.binary("sub", 1.0, share)) if wb else None
        return (sum_to(da, self.shapes[0]) if da is not None else None,
                sum_to(db, self.shapes[1]) if db is not None else None)


def _binary(op, a, b):
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError(f"{op} needs a netcl Tensor operand")
    q = _queue(a, b)
    a, b = _operand(a, q), _operand(b, q)
    y = array_ops.binary(op, a, b)
    return attach(Binary(op, a, b), y) if needs_record(a, b) else y


@traced("add")
def add(a, b):
    """a + b with broadcasting."""
    return _binary("add", a, b)


@traced("sub")
def sub(a, b):
    """a - b with broadcasting."""
    return _binary("sub", a, b)


@traced("mul")
def mul(a, b):
    """a * b with broadcasting."""
    return _binary("mul", a, b)


@traced("div")
def div(a, b):
    """a / b with broadcasting."""
    return _binary("div", a, b)


@traced("maximum")
def maximum(a, b):
    """The larger of a and b, element by element."""
    return _binary("maximum", a, b)


@traced("minimum")
def minimum(a, b):
    """The smaller of a and b, element by element."""
    return _binary("minimum", a, b)


@traced("pow")
def pow(a, b):
    """a ** b (a number exponent: one kernel)."""
    if isinstance(a, Tensor) and isinstance(b, _NUMBER):
        return _unary("square", a) if float(b) == 2.0 else _unary("pow", a, float(b))
    return _binary("pow", a, b)


@traced("compare")
def compare(op, a, b):
    """a op b element by element as a float tensor of 0 and 1 (no gradient); NotImplemented for an
    operand that is no number, array or tensor (Python then asks the other side: pytest.approx)."""
    q = _queue(a, b)
    try:
        a, b = _operand(a, q), _operand(b, q)
    except TypeError:
        return NotImplemented
    return array_ops.binary(op, a, b)


# -- element-wise with one operand -------------------------------------------------------------------------
class Unary(Node):
    """An element-wise function's backward."""
    def __init__(self, op, x, y, p0, p1):
        super().__init__((x,))
        self.op, self.p0, self.p1 = op, p0, p1
        self.save(y if op in ("exp", "sqrt") else x)

    @property
    def name(self):
        """The node\'s name in messages and reprs."""
        return f"{self.op.capitalize()}Backward"

    def backward(self, dy):
        (s,) = self.saved_tensors()
        op, p0, p1 = self.op, self.p0, self.p1
        if op == "neg":
            return (array_ops.unary("neg", dy),)
        if op == "exp":
            return (array_ops.binary("mul", dy, s),)
        if op == "log":
            return (array_ops.binary("div", dy, s),)
        if op == "sqrt":
            return (array_ops.binary("sqrt_grad", dy, s),)
        if op == "abs":
            return (array_ops.binary("abs_grad", dy, s),)
        if op == "clamp":
            return (array_ops.binary("clamp_grad", dy, s, p0, p1),)
        if op == "square":
            return (array_ops.binary("mul", dy, array_ops.binary("mul", s, 2.0)),)
        if op == "pow":
            return (array_ops.binary("pow_grad", dy, s, p0),)
        if op == "affine":
            return (array_ops.binary("mul", dy, p0),)
        if op == "sin":
            return (array_ops.binary("mul", dy, array_ops.unary("cos", s)),)
        if op == "cos":
            return (array_ops.unary("neg", array_ops.binary("mul", dy, array_ops.unary("sin", s))),)
        raise AssertionError(op)


def _unary(op, x, p0=0.0, p1=0.0):
    x = _float_tensor(x)
    y = array_ops.unary(op, x, p0, p1)
    return attach(Unary(op, x, y, p0, p1), y) if needs_record(x) else y


@traced("neg")
def neg(x):
    """-x."""
    return _unary("neg", x)


@traced("exp")
def exp(x):
    """e ** x."""
    return _unary("exp", x)


@traced("log")
def log(x):
    """The natural logarithm."""
    return _unary("log", x)


@traced("sqrt")
def sqrt(x):
    """The square root."""
    return _unary("sqrt", x)


@traced("abs")
def abs(x):
    """|x|."""
    return _unary("abs", x)


@traced("sin")
def sin(x):
    """sin(x)."""
    return _unary("sin", x)


@traced("cos")
def cos(x):
    """cos(x)."""
    return _unary("cos", x)


class ClampBackward(Node):
    """clamp with tensor bounds: dy to x inside [min, max] (bounds included), to min where x is below
    it and min < max, to max where x is above it or max < min (PyTorch's rule: ties go to x)."""

    def __init__(self, x, lo, hi):
        super().__init__((x, lo, hi))
        self.shapes = tuple(t.shape if isinstance(t, Tensor) else None for t in (x, lo, hi))
        self.numbers = (lo, hi)
        self.save(*[t for t in (x, lo, hi) if isinstance(t, Tensor)])

    def backward(self, dy):
        saved = list(self.saved_tensors())
        x = saved.pop(0)
        lo, hi = (saved.pop(0) if isinstance(n, Tensor) else n for n in self.numbers)
        lo, hi = -math.inf if lo is None else lo, math.inf if hi is None else hi
        b = array_ops.binary
        wx, wlo, whi = self.wants
        dx = dlo = dhi = None
        if wx:
            dx = b("mul", b("mul", dy, b("ge", x, lo)), b("le", x, hi))
        if wlo:  # (a tensor bound: b() has one tensor operand at least)
            dlo = b("mul", b("mul", dy, b("lt", x, lo)), b("lt", lo, hi))
        if whi:
            dhi = b("mul", dy, b("maximum", b("gt", x, hi), b("lt", hi, lo)))
        return tuple(None if d is None else sum_to(d, shape) for d, shape in zip((dx, dlo, dhi), self.shapes))


@traced("clamp")
def clamp(x, min=None, max=None):
    """min(max(x, min), max): x limited to [min, max], max where min > max (number bounds: one kernel)."""
    if min is None and max is None:
        raise ValueError("clamp needs min or max")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        x = _float_tensor(x)
        lo, hi = (None if t is None else _operand(t, x.queue) for t in (min, max))
        y = x if lo is None else array_ops.binary("maximum", x, lo)
        y = y if hi is None else array_ops.binary("minimum", y, hi)
        return attach(ClampBackward(x, lo, hi), y) if needs_record(x, lo, hi) else y
    lo = -math.inf if min is None else float(min)
    hi = math.inf if max is None else float(max)
    return _unary("clamp", x, lo, hi)


# -- activations (the layers' kernels) ----------------------------------------------------------------
class Activation(Node):
    """An activation's backward (act.h's gradient, from its input or its output)."""
    def __init__(self, act, slope, x, y):
        super().__init__((x,))
        self.act, self.slope = act, slope
        self.save(y if act.saves_output else x)

    @property
    def name(self):
        """The node\'s name in messages and reprs."""
        return f"{self.act.name.title().replace('_', '')}Backward"

    def backward(self, dy):
        (s,) = self.saved_tensors()
        bwd = ops.act_bwd_cpu if ops.is_cpu(dy.queue) else ops.act_bwd
        return (bwd(self.act, s, dy, self.slope),)


@traced("activation")
def activation(x, act, slope=0.0):
    """act(x) for a netcl.act.Act code (relu, sigmoid, tanh, gelu, silu, ...)."""
    act = Act(act)
    x = _float_tensor(x)
    y = (ops.act_fwd_cpu if ops.is_cpu(x.queue) else ops.act_fwd)(act, x, slope)
    return attach(Activation(act, slope, x, y), y) if needs_record(x) else y


@traced("relu")
def relu(x):
    """max(x, 0)."""
    return activation(x, Act.RELU)


@traced("sigmoid")
def sigmoid(x):
    """1 / (1 + exp(-x))."""
    return activation(x, Act.SIGMOID)


@traced("tanh")
def tanh(x):
    """tanh(x)."""
    return activation(x, Act.TANH)


# -- softmax ----------------------------------------------------------------------------------------------
def _around(shape, d):
    """(outer, D, inner) of `shape` around dimension d."""
    return math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])


class Softmax(Node):
    """softmax's backward (the softmax kernels' own)."""
    def __init__(self, x, y, d):
        super().__init__((x,))
        self.d = d
        self.save(y)

    def backward(self, dy):
        (y,) = self.saved_tensors()
        dx = ops.new(dy, dy.shape)
        return (ops.softmax_bwd(dy.queue, *_around(y.shape, self.d), y, dy, dx, 1.0),)


@traced("softmax")
def softmax(x, dim):
    """exp(x) / sum(exp(x)) along dim."""
    x = _float_tensor(x)
    d = _dim(dim, x.ndim)
    if x.ndim == 0:  # (as PyTorch: the one element's softmax, 1)
        return softmax(x.reshape(1), 0).reshape(())
    y = ops.new(x, x.shape)
    if y.size:
        ops.softmax_fwd(x.queue, *_around(x.shape, d), x, y)
    return attach(Softmax(x, y, d), y) if needs_record(x) else y


class LogSoftmax(Node):
    """log_softmax's backward: dy - softmax * sum(dy)."""
    def __init__(self, x, y, d):
        super().__init__((x,))
        self.d = d
        self.save(y)

    def backward(self, dy):  # dx = dy - softmax * sum(dy)
        (y,) = self.saved_tensors()
        total = _reduce_raw("sum", dy, (self.d,), keepdim=True)[0]
        return (array_ops.binary("sub", dy, array_ops.binary("mul", array_ops.unary("exp", y), total)),)


@traced("log_softmax")
def log_softmax(x, dim):
    """x - logsumexp(x) along dim, from the maximum (no overflow, no log of an underflowed softmax)."""
    x = _float_tensor(x)
    d = _dim(dim, x.ndim)
    if x.ndim == 0:
        return log_softmax(x.reshape(1), 0).reshape(())
    m = _reduce_raw("max", x, (d,), keepdim=True)[0]
    shifted = array_ops.binary("sub", x, m)
    lse = array_ops.unary("log", _reduce_raw("sum", array_ops.unary("exp", shifted), (d,), keepdim=True)[0])
    y = array_ops.binary("sub", shifted, lse)
    return attach(LogSoftmax(x, y, d), y) if needs_record(x) else y


# -- reductions -------------------------------------------------------------------------------------------------
def _runs(dims):
    """Sorted dims as runs of consecutive ones: [(first, last + 1), ...]."""
    runs = []
    for d in dims:
        if runs and runs[-1][1] == d:
            runs[-1][1] = d + 1
        else:
            runs.append([d, d + 1])
    return runs


def _reduce_raw(op, x, dims, keepdim=False, scale=1.0, want_idx=False):
    """(x reduced over dims, int indices along the one reduced dim or None), no autograd. A mean
    passes scale = 1/count (applied once, by the last launch)."""
    shape = list(x.shape)
    y, idx = x, None
    runs = _runs(dims)
    for i, (lo, hi) in enumerate(reversed(runs)):  # the innermost run first: outer positions stay put
        outer, R, inner = math.prod(shape[:lo]), math.prod(shape[lo:hi]), math.prod(shape[hi:])
        y, idx = array_ops.reduce_dim(op, y, outer, R, inner, want_idx=want_idx,
                                      scale=scale if i == len(runs) - 1 else 1.0)
        shape[lo:hi] = [1] * (hi - lo)
    out = tuple(shape) if keepdim else tuple(n for k, n in enumerate(shape) if k not in dims)
    y = y._view(out)
    return y, (idx._view(out) if idx is not None else None)


class Sum(Node):
    """sum's and mean's backward: the gradient broadcast back (times 1/count for a mean)."""
    def __init__(self, x, dims, keepdim, scale):
        super().__init__((x,))
        self.shape, self.dims, self.keepdim, self.scale = x.shape, dims, keepdim, scale

    @property
    def name(self):
        """The node\'s name in messages and reprs."""
        return "MeanBackward" if self.scale != 1.0 else "SumBackward"

    def backward(self, dy):
        keep = tuple(1 if k in self.dims else n for k, n in enumerate(self.shape))
        g = dy._view(keep)
        if self.scale == 1.0:
            return (expand_to(g, self.shape),)
        return (array_ops.binary("mul", g, self.scale, out_shape=self.shape),)


@traced("sum")
def sum(x, dim=None, keepdim=False):
    """The sum over dim (None: all)."""
    x = _float_tensor(x)
    dims = _dims(dim, x.ndim, empty_is_all=True)
    y = _reduce_raw("sum", x, dims, keepdim)[0]
    return attach(Sum(x, dims, keepdim, 1.0), y) if needs_record(x) else y


@traced("mean")
def mean(x, dim=None, keepdim=False):
    """The mean over dim (None: all)."""
    x = _float_tensor(x)
    dims = _dims(dim, x.ndim, empty_is_all=True)
    count = math.prod(x.shape[d] for d in dims)
    scale = 1.0 / count if count else float("nan")
    y = _reduce_raw("sum", x, dims, keepdim, scale=scale)[0]
    return attach(Sum(x, dims, keepdim, scale), y) if needs_record(x) else y


class Extremum(Node):
    """amax/amin (and max/min without dim): dy shared evenly by the elements equal to the result."""

    def __init__(self, x, y, dims):
        super().__init__((x,))
        self.dims = dims
        self.save(x, y)

    def backward(self, dy):
        x, y = self.saved_tensors()
        keep = tuple(1 if k in self.dims else n for k, n in enumerate(x.shape))
        mask = array_ops.binary("eq", x, y._view(keep))
        count = _reduce_raw("sum", mask, self.dims, keepdim=True)[0]
        return (array_ops.binary("mul", mask, array_ops.binary("div", dy._view(keep), count)),)


class Picked(Node):
    """max/min along a dim: dy to the index each value came from."""

    def __init__(self, x, idx, d):
        super().__init__((x,))
        self.shape, self.d = x.shape, d
        self.save(idx)

    def backward(self, dy):
        (idx,) = self.saved_tensors()
        outer, C, inner = _around(self.shape, self.d)
        return (array_ops.take_backward(dy, idx, outer, C, inner)._view(self.shape),)


def _extremum(op, x, dim, keepdim, values_only):
    x = _float_tensor(x)
    if x.size == 0:
        raise ValueError(f"{op} of an empty tensor (shape {x.shape}): there is no {op}imum")
    if dim is None or values_only:
        dims = _dims(dim, x.ndim, empty_is_all=True)
        y = _reduce_raw(op, x, dims, keepdim)[0]
        return attach(Extremum(x, y, dims), y) if needs_record(x) else y
    d = _dim(dim, x.ndim)
    y, idx = _reduce_raw(op, x, (d,), keepdim, want_idx=True)
    if needs_record(x):
        attach(Picked(x, idx, d), y)
    return MaxResult(y, idx)


class MaxResult(tuple):
    """(values, indices) of max/min along a dimension, as torch.return_types.max."""

    def __new__(cls, values, indices):
        return tuple.__new__(cls, (values, indices))

    @property
    def values(self):
        """The maximum (minimum) values."""
        return self[0]

    @property
    def indices(self):
        """The indices (int32) of the values along the reduced dimension."""
        return self[1]


@traced("max")
def max(x, dim=None, keepdim=False):
    """The maximum, or (values, indices) along dim."""
    return _extremum("max", x, dim, keepdim, False)


@traced("min")
def min(x, dim=None, keepdim=False):
    """The minimum, or (values, indices) along dim."""
    return _extremum("min", x, dim, keepdim, False)


@traced("amax")
def amax(x, dim=None, keepdim=False):
    """The maximum over dim (None: all)."""
    return _extremum("max", x, dim, keepdim, True)


@traced("amin")
def amin(x, dim=None, keepdim=False):
    """The minimum over dim (None: all)."""
    return _extremum("min", x, dim, keepdim, True)


def _arg(op, x, dim, keepdim):
    x = _float_tensor(x)
    if x.size == 0:
        raise ValueError(f"arg{op} of an empty tensor (shape {x.shape})")
    if dim is None:
        _, idx = _reduce_raw(op, x._view((x.size,)), (0,), want_idx=True)
        return idx._view((1,) * x.ndim if keepdim else ())
    return _reduce_raw(op, x, (_dim(dim, x.ndim),), keepdim, want_idx=True)[1]


@traced("argmax")
def argmax(x, dim=None, keepdim=False):
    """The index of the first maximum (int32)."""
    return _arg("max", x, dim, keepdim)


@traced("argmin")
def argmin(x, dim=None, keepdim=False):
    """The index of the first minimum (int32)."""
    return _arg("min", x, dim, keepdim)


# -- matrix products --------------------------------------------------------------------------------------------
def _mm(a, b, ta=False, tb=False):
    """op(a) @ op(b) over the last two dims with one batch dimension in front (or none), no autograd."""
    if a.ndim == 2 and b.ndim == 2:
        return ops.matmul(a, b, trans_a=ta, trans_b=tb)
    B = a.shape[0]
    M, K = (a.shape[2], a.shape[1]) if ta else (a.shape[1], a.shape[2])
    N = b.shape[1] if tb else b.shape[2]
    ka, kb = a.shape[1] * a.shape[2], b.shape[1] * b.shape[2]
    sa = (1, a.shape[2], ka) if ta else (a.shape[2], 1, ka)
    sb = (1, b.shape[2], kb) if tb else (b.shape[2], 1, kb)
    y = ops.new(a, (B, M, N))
    return ops.gemm(M, N, K, a, sa, b, sb, y, (N, 1, M * N), batch=B)


class MatMul(Node):
    """a @ b computed as a3 @ b3 (2-D, or 3-D with one batch dimension); the gradients come back
    to the operands' shapes through their matrix forms am, bm (1-D operands as a row, a column)."""

    def __init__(self, a, b, a3, b3, out3, am_shape, bm_shape, batch):
        super().__init__((a, b))
        self.shapes, self.out3 = (a.shape, b.shape), out3
        self.mshapes, self.batch = (am_shape, bm_shape), batch
        self.save(a3, b3)

    def backward(self, dy):
        a3, b3 = self.saved_tensors()
        g = dy._view(self.out3)
        wa, wb = self.wants
        da = _mm(g, b3, tb=True) if wa else None
        db = _mm(a3, g, ta=True) if wb else None  # a batch folded into M sums here, over K
        return self._back(da, 0), self._back(db, 1)

    def _back(self, g, i):
        """Gradient g of operand i from its matrix form (with the batch) to the operand's shape."""
        if g is None:
            return None
        shape, mshape = self.shapes[i], self.mshapes[i]
        if g.size != math.prod(mshape):  # the operand was broadcast over batch dimensions
            g = sum_to(g._view(self.batch + mshape[-2:]), mshape)
        return g._view(shape)


@traced("matmul")
def matmul(a, b):
    """a @ b with PyTorch's rules: 1-D operands as a row or a column, batch dimensions broadcast."""
    q = _queue(a, b)
    a, b = _operand(a, q), _operand(b, q)
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        raise TypeError("matmul takes two tensors")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul takes tensors of at least one dimension; use * for a scalar")
    am = a._view((1, a.shape[0])) if a.ndim == 1 else a
    bm = b._view((b.shape[0], 1)) if b.ndim == 1 else b
    if am.shape[-1] != bm.shape[-2]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not match ({am.shape[-1]} != {bm.shape[-2]})")
    batch = array_ops.broadcast_shapes(am.shape[:-2], bm.shape[:-2])
    M, N = am.shape[-2], bm.shape[-1]
    nb = math.prod(batch)
    if not batch:
        a3, b3 = am, bm
    elif bm.ndim == 2:  # (..., M, K) @ (K, N): the batch folds into M
        a3, b3 = am._view((-1, am.shape[-1])), bm
    else:
        a3 = expand_to(am, batch + am.shape[-2:])._view((nb,) + am.shape[-2:])
        b3 = expand_to(bm, batch + bm.shape[-2:])._view((nb,) + bm.shape[-2:])
    y3 = _mm(a3, b3)
    out = batch + ((M,) if a.ndim > 1 else ()) + ((N,) if b.ndim > 1 else ())
    y = y3._view(out)
    if needs_record(a, b):
        attach(MatMul(a, b, a3, b3, y3.shape, am.shape, bm.shape, batch), y)
    return y


# -- shapes --------------------------------------------------------------------------------------------------------
class View(Node):
    """A view's backward: the gradient in the input's shape."""
    def __init__(self, x):
        super().__init__((x,))
        self.shape = x.shape

    def backward(self, dy):
        return (dy._view(self.shape),)


def record_view(x, v):
    """Tensor.reshape's view of x, recorded where x requires grad."""
    return attach(View(x), v) if needs_record(x) else v


@traced("reshape")
def reshape(x, *shape):
    """x with a new shape (a view; one -1 is inferred)."""
    return x.reshape(*shape)


@traced("detach")
def detach(x):
    """x's data cut from autograd's graph (a view)."""
    return x.detach()


@traced("flatten")
def flatten(x, start_dim=0, end_dim=-1):
    """Dimensions start_dim..end_dim merged (a view)."""
    x = _tensor(x)
    if x.ndim == 0:
        return x.reshape(1)
    s, e = _dim(start_dim, x.ndim, "start_dim"), _dim(end_dim, x.ndim, "end_dim")
    if s > e:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {x.shape}")
    return x.reshape(x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


@traced("squeeze")
def squeeze(x, dim=None):
    """Dimensions of size 1 dropped (a view)."""
    x = _tensor(x)
    if dim is None:
        return x.reshape(tuple(n for n in x.shape if n != 1))
    dims = _dims(dim, x.ndim)
    return x.reshape(tuple(n for k, n in enumerate(x.shape) if not (k in dims and n == 1)))


@traced("unsqueeze")
def unsqueeze(x, dim):
    """A dimension of size 1 inserted (a view)."""
    x = _tensor(x)
    d = _dim(dim, x.ndim + 1)
    return x.reshape(x.shape[:d] + (1,) + x.shape[d:])


class Permute(Node):
    """permute's backward: the inverse permutation."""
    def __init__(self, x, order):
        super().__init__((x,))
        self.inverse = tuple(np.argsort(order))

    def backward(self, dy):
        return (_permute_raw(dy, self.inverse),)


def _permute_raw(x, order):
    shape = tuple(x.shape[k] for k in order)
    strides = array_ops.contiguous_strides(x.shape)
    y = _like(x, shape)
    return array_ops.copy_strided(x, shape, tuple(strides[k] for k in order), 0, y,
                                  array_ops.contiguous_strides(shape), 0)


@traced("permute")
def permute(x, *dims):
    """The dimensions in a new order (a copy unless the elements keep their order)."""
    x = _tensor(x)
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    order = tuple(_dim(d, x.ndim) for d in dims)
    if sorted(order) != list(range(x.ndim)):
        raise ValueError(f"permute: {dims} is not an order of the {x.ndim} dimensions of shape {x.shape}")
    if [k for k in order if x.shape[k] != 1] == sorted(k for k in order if x.shape[k] != 1):
        return x.reshape(tuple(x.shape[k] for k in order))  # the elements keep their order: a view
    y = _permute_raw(x, order)
    return attach(Permute(x, order), y) if needs_record(x) else y


@traced("transpose")
def transpose(x, dim0, dim1):
    """Two dimensions swapped."""
    x = _tensor(x)
    order = list(range(x.ndim))
    a, b = _dim(dim0, x.ndim), _dim(dim1, x.ndim)
    order[a], order[b] = order[b], order[a]
    return permute(x, *order)


class Expand(Node):
    """expand's backward: the gradient summed back to the input's shape."""
    def __init__(self, x):
        super().__init__((x,))
        self.shape = x.shape

    def backward(self, dy):
        return (sum_to(dy, self.shape),)


@traced("expand")
def expand(x, *shape):
    """x broadcast out to `shape` (a copy)."""
    x = _tensor(x)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    pad = len(shape) - x.ndim
    if pad < 0:
        raise ValueError(f"expand: shape {shape} has fewer dimensions than the tensor's {x.shape}")
    shape = tuple(x.shape[k - pad] if n == -1 and k >= pad else int(n) for k, n in enumerate(shape))
    if array_ops.broadcast_shapes(x.shape, shape) != shape:
        raise ValueError(f"expand: {x.shape} cannot be expanded to {shape}")
    y = expand_to(x, shape)
    if y is x:
        return x
    return attach(Expand(x), y) if needs_record(x) else y


class Copy(Node):
    """clone's backward: the gradient as it is."""
    def backward(self, dy):
        return (dy,)


@traced("clone")
def clone(x):
    """A copy in autograd's graph."""
    x = _tensor(x)
    y = _like(x, x.shape)
    y.copy_(x)
    return attach(Copy((x,)), y) if needs_record(x) else y


# -- indexing -----------------------------------------------------------------------------------------------------
def _index_plan(shape, index):
    """(output shape, element strides into the source per output dim, offset) of basic indexing."""
    if not isinstance(index, tuple):
        index = (index,)
    if builtins.sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexError("an index can hold one ellipsis (...)")
    used = builtins.sum(1 for i in index if i is not None and i is not Ellipsis)
    if used > len(shape):
        raise IndexError(f"too many indices ({used}) for a tensor of shape {shape}")
    if Ellipsis in [i for i in index if not isinstance(i, Tensor)]:
        k = [j for j, i in enumerate(index) if i is Ellipsis][0]
        index = index[:k] + (slice(None),) * (len(shape) - used) + index[k + 1:]
    index = index + (slice(None),) * (len(shape) - builtins.sum(1 for i in index if i is not None))
    strides = array_ops.contiguous_strides(shape)
    out, out_strides, offset, d = [], [], 0, 0
    for i in index:
        if i is None:
            out.append(1)
            out_strides.append(0)
            continue
        n = shape[d]
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step <= 0:
                raise NotImplementedError("slices with a negative step are not supported (PyTorch refuses them too)")
            count = builtins.max(0, -(-(stop - start) // step))
            out.append(count)
            out_strides.append(strides[d] * step)
            offset += start * strides[d] if count else 0
        elif isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)):
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of range for dimension {d} of size {n}")
            offset += (int(i) % n) * strides[d]
        else:
            raise NotImplementedError(f"indexing with {type(i).__name__} is not supported: netcl takes ints, "
                                      "slices, ... and None (basic indexing)")
        d += 1
    return tuple(out), tuple(out_strides), offset


class Index(Node):
    """Indexing's backward: the gradient written into zeros at the indexed places."""
    def __init__(self, x, plan):
        super().__init__((x,))
        self.shape, self.plan = x.shape, plan

    def backward(self, dy):
        out, strides, offset = self.plan
        dx = ops.new(dy, self.shape).fill_(0.0)
        return (array_ops.copy_strided(dy, out, array_ops.contiguous_strides(out), 0, dx, strides, offset),)


@traced("getitem")
def getitem(x, index):
    """Basic indexing: ints, slices, ... and None (a copy)."""
    x = _tensor(x)
    plan = _index_plan(x.shape, index)
    out, strides, offset = plan
    y = _like(x, out)
    array_ops.copy_strided(x, out, strides, offset, y, array_ops.contiguous_strides(out), 0)
    return attach(Index(x, plan), y) if needs_record(x) else y


# -- joining --------------------------------------------------------------------------------------------------------
class Cat(Node):
    """cat's backward: each input's slice of the gradient."""
    def __init__(self, xs, d):
        super().__init__(xs)
        self.shapes, self.d = [x.shape for x in xs], d

    def backward(self, dy):
        out, start = [], 0
        for shape, want in zip(self.shapes, self.inputs):
            n = shape[self.d]
            if want is not None:
                index = (slice(None),) * self.d + (slice(start, start + n),)
                plan = _index_plan(dy.shape, index)
                g = ops.new(dy, plan[0])
                out.append(array_ops.copy_strided(dy, plan[0], plan[1], plan[2], g,
                                                  array_ops.contiguous_strides(plan[0]), 0))
            else:
                out.append(None)
            start += n
        return tuple(out)


@traced("cat")
def cat(tensors, dim=0):
    """Tensors of one shape but along `dim`, joined along it."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat needs at least one tensor")
    if not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError("cat takes netcl Tensors")
    q = _queue(*tensors)
    ints = all(t.dtype == INT32 for t in tensors)  # int tensors stay int (a bit-for-bit copy)
    xs = [_on(t, q) if ints else _operand(t, q) for t in tensors]
    d = _dim(dim, xs[0].ndim)
    first = xs[0].shape
    for i, x in enumerate(xs):
        if x.ndim != len(first) or x.shape[:d] + x.shape[d + 1:] != first[:d] + first[d + 1:]:
            raise ValueError(f"cat along dim {dim}: tensor {i} has shape {x.shape}, tensor 0 {first} (all must agree "
                             "off that dimension)")
    out = first[:d] + (builtins.sum(x.shape[d] for x in xs),) + first[d + 1:]
    y = Tensor.empty(q, out, INT32) if ints else ops.new(q, out)
    ostrides, start = array_ops.contiguous_strides(out), 0
    for x in xs:
        array_ops.copy_strided(x, x.shape, array_ops.contiguous_strides(x.shape), 0, y, ostrides, start * ostrides[d])
        start += x.shape[d]
    return attach(Cat(xs, d), y) if needs_record(*xs) else y


@traced("stack")
def stack(tensors, dim=0):
    """Tensors of one shape joined along a new dimension `dim`."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack needs at least one tensor")
    shapes = {t.shape for t in tensors if isinstance(t, Tensor)}
    if len(shapes) != 1:
        raise ValueError(f"stack needs tensors of one shape, got {sorted(shapes)}")
    return cat([unsqueeze(t, dim) for t in tensors], dim)


def split(x, split_size_or_sections, dim=0):
    """x cut along dim into pieces of split_size (the last one smaller where it does not divide) or
    of the listed sizes, as torch.split: a tuple of copies, each a slice in autograd's graph."""
    x = _tensor(x)
    d = _dim(dim, x.ndim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, (int, np.integer)):
        if split_size_or_sections <= 0:
            raise ValueError(f"split: split_size must be positive, got {split_size_or_sections}")
        sizes = [builtins.min(int(split_size_or_sections), n - i) for i in range(0, n, int(split_size_or_sections))]
    else:
        sizes = [int(v) for v in split_size_or_sections]
        if builtins.sum(sizes) != n or builtins.min(sizes, default=0) < 0:
            raise ValueError(f"split: sections {sizes} do not add up to dimension {d}'s size {n}")
    pieces, at = [], 0
    for size in sizes:
        pieces.append(x[(slice(None),) * d + (slice(at, at + size),)])
        at += size
    return tuple(pieces)


def chunk(x, chunks, dim=0):
    """x cut along dim into `chunks` pieces of ceil(size / chunks) (fewer where that covers it), as
    torch.chunk."""
    x = _tensor(x)
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    n = x.shape[_dim(dim, x.ndim)]
    return split(x, builtins.max(1, -(-n // int(chunks))), dim)


# -- types -----------------------------------------------------------------------------------------------------------
@traced("cast")
def cast(x, dtype):
    """x as float32 or int32 (a new tensor where the type changes)."""
    x = _tensor(x)
    if x.dtype == dtype:
        return x
    if dtype == INT32:
        return array_ops.to_int(x)
    return array_ops.to_float(x)


# -- in place -----------------------------------------------------------------------------------------------------------
def check_inplace(x):
    """RuntimeError for an in-place change autograd cannot follow (a tensor that requires grad,
    while grad mode is on)."""
    if x.requires_grad and autograd.is_grad_enabled():
        raise RuntimeError("an in-place operation on a tensor that requires grad: autograd would lose the values "
                           "it needs; compute out of place (x = x + y), or inside netcl.no_grad() for a "
                           "parameter update")


def inplace(op, x, other):
    """x op= other, written into x's storage (its version counts the write)."""
    check_inplace(x)
    if isinstance(other, Tensor) and other.requires_grad and autograd.recording():
        raise RuntimeError("an in-place operation whose operand requires grad: compute out of place")
    q = _queue(x)
    o = _operand(other, q)
    if x.dtype != FLOAT32:
        raise TypeError("in-place arithmetic takes float32 tensors")
    shape = array_ops.broadcast_shapes(x.shape, o.shape if isinstance(o, Tensor) else ())
    if shape != x.shape:
        raise ValueError(f"in-place {op}: the result's shape {shape} is not the tensor's {x.shape}")
    y = array_ops.binary(op, x, o)
    x.copy_(y)
    trace_inplace(op, (x, other), x)
    return x


def trace_inplace(name, args, x):
    """During netcl.trace, an in-place change of x recorded as operation `name` on args whose result
    x now stands for (a graph replays it out of place)."""
    tr = autograd.tracer()
    if tr is not None:
        tr.op(name, args, {}, x)


@traced("full_like")
def full_like(x, value):
    """A new tensor of x's shape and dtype filled with `value` (what a traced fill_/zero_ replays)."""
    return _like(_tensor(x), x.shape).fill_(value)


# -- making tensors ---------------------------------------------------------------------------------------------------
def _place(t, queue, requires_grad):
    if queue is not None:
        t.to(queue)
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensor(data, queue=None, requires_grad=False, dtype=None):
    """A tensor of `data` (an array-like; a Tensor is copied): integers give an int32 tensor
    (class targets, indices), anything else float32; dtype=np.float32 or np.int32 chooses. On
    `queue`'s device, else on the host until first used (then on the default device)."""
    if isinstance(data, Tensor):
        data = data.to_host()
    a = np.asarray(data)
    if a.dtype.kind == "c" or a.dtype.kind not in "biuf":
        raise TypeError(f"netcl.tensor takes numbers (ints, floats, bools), got {a.dtype}")
    want = np.dtype(dtype) if dtype is not None else (INT32 if a.dtype.kind in "iu" else FLOAT32)
    if want == INT32:
        t = Tensor(a.shape, None, None, array_ops.host_ints(a), dtype=INT32)
    elif want == FLOAT32:
        t = Tensor.from_host(None, a)
    else:
        raise TypeError(f"netcl tensors hold float32 or int32, got dtype={dtype}")
    return _place(t, queue, requires_grad)


def _shape_args(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int(n) for n in shape)


@traced("zeros")
def zeros(*shape, queue=None, requires_grad=False):
    """A tensor of zeros of `shape` (on `queue`, else on the host until used)."""
    shape = _shape_args(shape)
    return _place(Tensor.from_host(None, np.zeros(shape, np.float32)), queue, requires_grad)


@traced("ones")
def ones(*shape, queue=None, requires_grad=False):
    """A tensor of ones of `shape` (on `queue`, else on the host until used)."""
    shape = _shape_args(shape)
    return _place(Tensor.from_host(None, np.ones(shape, np.float32)), queue, requires_grad)


@traced("randn")
def randn(*shape, queue=None, requires_grad=False):
    """Standard normal values from netcl's generator (netcl.manual_seed)."""
    values = rng().standard_normal(_shape_args(shape), dtype=np.float32)
    return _place(Tensor.from_host(None, values), queue, requires_grad)


def arange(start, end=None, step=1, queue=None):
    """[start, end) in steps, as torch.arange: int32 where all three are ints, else float32."""
    if end is None:
        start, end = 0, start
    ints = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    a = np.arange(start, end, step, dtype=np.int64 if ints else np.float64)
    return tensor(a, queue=queue, dtype=INT32 if ints else FLOAT32)


def backward(t, gradient, retain_graph):
    """Tensor.backward's autograd walk."""
    autograd.backward(t, gradient, retain_graph)


def tracing():
    """Whether netcl.trace is recording this thread's operations (Tensor routes reshape here then)."""
    return autograd.tracer() is not None


def refuse_in_trace(t, what):
    """During netcl.trace, reading a tensor's value (bool, int, item, numpy) makes the graph depend on
    the example: TraceError naming the line of the traced code that did it."""
    tr = autograd.tracer()
    if tr is not None:
        tr.refuse(what)


install(sys.modules[__name__])  # Tensor's operators call this module
