"""Launchers of tensor.cl, the kernels behind Tensor operations: broadcasting element-wise
operations, reductions, strided copies, index gathers and casts. Python works out shapes and
strides (NumPy's broadcasting rules, dimensions merged where every operand walks them alike);
the kernels take them as arguments, so a new shape builds nothing. Every function enqueues
without waiting and returns new contiguous device tensors."""
import math

import numpy as np

from netcl import ops
from netcl.runtime import kernels
from netcl.tensor import INT32, Tensor

# operation -> its code in tensor.cl (-DOP2 for ew2, -DOP1 for ew1, -DRED for reduce)
BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3, "pow": 4, "maximum": 5, "minimum": 6, "eq": 7, "ne": 8,
          "lt": 9, "le": 10, "gt": 11, "ge": 12, "sqrt_grad": 13, "abs_grad": 14, "clamp_grad": 15,
          "pow_grad": 16, "grad_where_eq": 17, "pow_grad_base": 18,
          "pow_grad_exponent": 19}
UNARY = {"neg": 0, "exp": 1, "log": 2, "sqrt": 3, "abs": 4, "clamp": 5, "pow": 6, "square": 7,
         "reciprocal": 8, "sign": 9, "sin": 10, "cos": 11, "affine": 12}
REDUCE = {"sum": 0, "max": 1, "min": 2}
MAX_DIMS = 8  # tensor.cl's index vectors (int8): dimensions left after merging
_GPU_LOCAL = 64


def _family(q, macro, code):
    """tensor.cl's kernels built for one operation and the queue's device class."""
    cpu = ("-DCPU",) if ops.is_cpu(q) else ()
    return kernels(q, "tensor", cpu + (f"-D{macro}={code}",))


_vectors = {}  # tuple of 8 ints -> the int8 kernel argument


def _int8(values):
    v = _vectors.get(values)
    if v is None:
        import pyopencl.cltypes as cltypes

        v = _vectors[values] = cltypes.make_int8(*values)
    return v


def broadcast_shapes(*shapes):
    """The shape NumPy's broadcasting gives `shapes`, or ValueError naming them."""
    ndim = max(len(s) for s in shapes)
    out = []
    for k in range(ndim):
        sizes = {s[len(s) - ndim + k] for s in shapes if len(s) - ndim + k >= 0} - {1}
        if len(sizes) > 1:
            raise ValueError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast: dimension "
                             f"{k - ndim} is {' vs '.join(str(n) for n in sorted(sizes))} (sizes must be equal "
                             "or 1)")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def contiguous_strides(shape):
    """Element strides of a contiguous tensor of `shape`."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _broadcast_strides(shape, out):
    """Element strides of a contiguous tensor of `shape` read as `out` (0 along broadcast dimensions)."""
    pad = len(out) - len(shape)
    own = contiguous_strides(shape)
    return tuple(0 if k < pad or shape[k - pad] == 1 else own[k - pad] for k in range(len(out)))


def _merge(shape, *strides):
    """(shape, strides...) innermost first with size-1 dimensions dropped and neighbours merged
    wherever every operand steps across them as across one dimension; at least one dimension."""
    dims = [(n, [s[k] for s in strides]) for k, n in enumerate(shape) if n != 1]
    merged = []
    for n, st in reversed(dims):  # innermost first
        if merged:
            m, mst = merged[-1]
            if all(o == i * m for o, i in zip(st, mst)):
                merged[-1] = (m * n, mst)
                continue
        merged.append((n, st))
    if not merged:
        merged = [(1, [0] * len(strides))]
    if len(merged) > MAX_DIMS:
        raise ValueError(f"an operation over shape {tuple(shape)} walks {len(merged)} dimensions after merging; "
                         f"netcl's kernels take at most {MAX_DIMS}")
    shp = tuple(n for n, _ in merged)
    return (shp,) + tuple(tuple(st[i] for _, st in merged) for i in range(len(strides)))


def _pad8(values, fill):
    return tuple(values) + (fill,) * (MAX_DIMS - len(values))


def _launch_elements(q, k, n, args):
    """A kernel over n output elements: on CPUs chunks per work-item (its last argument), on GPUs
    one element per work-item."""
    if ops.is_cpu(q):
        chunk, items = ops.cpu_chunk(n)
        ops._enqueue(q, k, (items,), (1,), args + (chunk,))
    else:
        ops._enqueue(q, k, (-(-n // _GPU_LOCAL) * _GPU_LOCAL,), (_GPU_LOCAL,), args + (0,))


_plans = {}  # (operand shapes (None: a number), out_shape) -> (output shape, its size, index vector arguments)
_MAX_PLANS = 4096  # (a program of ever new shapes: the cache starts over rather than grow without end)


def _binary_plan(sa, sb, out_shape):
    """binary()'s shape work, once per combination of shapes: (output shape, size, (nd, shape, strides a,
    strides b) as kernel arguments). Eager operations repeat their shapes, and this is their host time."""
    key = (sa, sb, out_shape)
    plan = _plans.get(key)
    if plan is None:
        out = broadcast_shapes(sa or (), sb or (), *([out_shape] if out_shape else []))
        stra = _broadcast_strides(sa, out) if sa is not None else (0,) * len(out)
        strb = _broadcast_strides(sb, out) if sb is not None else (0,) * len(out)
        shp, stra, strb = _merge(out, stra, strb)
        vectors = (len(shp), _int8(_pad8(shp, 1)), _int8(_pad8(stra, 0)), _int8(_pad8(strb, 0)))
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        plan = _plans[key] = (out, math.prod(out), vectors)
    return plan


def binary(op, a, b, p0=0.0, p1=0.0, out_shape=()):
    """op(a, b) with broadcasting (to `out_shape` too, where given); a or b may be a Python number
    (not both). Float tensors only."""
    ta, tb = isinstance(a, Tensor), isinstance(b, Tensor)
    q = a.queue if ta else b.queue
    out, n, (nd, shp, stra, strb) = _binary_plan(a.shape if ta else None, b.shape if tb else None, out_shape)
    y = ops.new(q, out)
    if n == 0:
        return y.mark_written()
    unused = y if not (ta and tb) else None  # (a number's buffer argument is never read)
    k = _family(q, "OP2", BINARY[op])["ew2"]
    _launch_elements(q, k, n, (n, nd, shp, a if ta else unused, stra, 0, 0.0 if ta else float(a), int(not ta),
                               b if tb else unused, strb, 0, 0.0 if tb else float(b), int(not tb),
                               float(p0), float(p1), y))
    return y.mark_written()


def unary(op, x, p0=0.0, p1=0.0):
    """op(x) element by element (x contiguous), into a new tensor."""
    y = ops.new(x, x.shape)
    if y.size:
        k = _family(x.queue, "OP1", UNARY[op])["ew1"]
        _launch_elements(x.queue, k, y.size, (y.size, x, float(p0), float(p1), y))
    return y.mark_written()


def reduce_dim(op, x, outer, R, inner, want_idx=False, scale=1.0):
    """x read as (outer, R, inner) reduced over R: (values (outer, inner), int indices or None)."""
    q = x.queue
    y = ops.new(q, (outer, inner))
    idx = Tensor.empty(q, (outer, inner), INT32) if want_idx else None
    if outer * inner:
        k = _family(q, "RED", REDUCE[op])["reduce"]
        args = (outer, R, inner, x, y, idx if want_idx else ops.dummy(q), int(want_idx), float(scale))
        if not ops.is_cpu(q):
            ops._enqueue(q, k, (outer * inner * _GPU_LOCAL,), (_GPU_LOCAL,), args + (0,))
        elif inner == 1:
            rows, items = ops.cpu_rows(outer, max(R, 1))
            ops._enqueue(q, k, (items,), (1,), args + (rows,))
        else:
            ops._enqueue(q, k, (outer * -(-inner // 16),), (1,), args + (0,))
    if want_idx:
        idx.mark_written()
    return y.mark_written(), idx


def copy_strided(src, shape, src_strides, src_offset, dst, dst_strides, dst_offset, accumulate=False):
    """dst[dst_offset + c . dst_strides] (+)= src[src_offset + c . src_strides] for every index c of
    `shape` (element strides; src and dst distinct buffers, dst's positions distinct)."""
    n = math.prod(shape)
    if n == 0:
        return dst
    shp, ss, ds = _merge(shape, src_strides, dst_strides)
    q = dst.queue
    k = _family(q, "OP2", 0)["copy_nd"]
    _launch_elements(q, k, n, (n, len(shp), _int8(_pad8(shp, 1)), src, _int8(_pad8(ss, 0)), int(src_offset), dst,
                               _int8(_pad8(ds, 0)), int(dst_offset), int(accumulate)))
    return dst.mark_written()


def take(x, idx, outer, C, inner):
    """y (outer, inner) = x (outer, C, inner) at int indices idx (outer, inner) along C."""
    y = ops.new(x, (outer, inner))
    if y.size:
        ops.launch1d(x.queue, "tensor", "take", y.size, y.size, C, inner, x, idx, y, options=_plain(x.queue))
    return y.mark_written()


def take_backward(dy, idx, outer, C, inner, dx=None):
    """dx (outer, C, inner) += dy scattered to the indices' places (a zero dx made where None)."""
    if dx is None:
        dx = ops.new(dy, (outer, C, inner)).fill_(0.0)
    if dy.size:
        ops.launch1d(dy.queue, "tensor", "take_bwd", dy.size, dy.size, C, inner, dy, idx, dx,
                     options=_plain(dy.queue))
    return dx.mark_written()


def _plain(q):
    """The build options of tensor.cl's operation-free kernels (take, casts): the copy family's."""
    return (("-DCPU",) if ops.is_cpu(q) else ()) + ("-DOP2=0",)


def to_float(x):
    """An int32 tensor as float32 (exact below 2**24)."""
    y = ops.new(x, x.shape)
    if y.size:
        ops.launch1d(x.queue, "tensor", "int_to_float", y.size, y.size, x, y, options=_plain(x.queue))
    return y.mark_written()


def to_int(x):
    """A float32 tensor as int32, rounded toward zero."""
    y = Tensor.empty(x.queue, x.shape, INT32)
    if y.size:
        ops.launch1d(x.queue, "tensor", "float_to_int", y.size, y.size, x, y, options=_plain(x.queue))
    return y.mark_written()


def host_ints(values):
    """An int array as int32 for the device, or ValueError where a value does not fit."""
    a = np.asarray(values)
    if a.size and (a.min() < -2**31 or a.max() >= 2**31):
        raise ValueError("integer tensors hold int32 on the device: a value does not fit")
    return a.astype(np.int32)
