"""Thin launchers for the kernels in netcl/kernels: Python picks shapes and launch sizes,
OpenCL does the arithmetic. Every function takes device Tensors and enqueues without waiting."""
import numpy as np

from netcl.runtime import alloc, kernels
from netcl.tensor import Tensor

_LOCAL = 64  # fixed 1-D work-group size: PoCL recompiles for every new local size


def _arg(a):
    if isinstance(a, Tensor):
        return a.buf
    if isinstance(a, (bool, np.bool_)):
        return np.int32(a)
    if isinstance(a, (int, np.integer)):
        return np.int32(a)
    if isinstance(a, (float, np.floating)):
        return np.float32(a)
    return a  # a buffer, or None for an unused pointer


def launch(queue, family, name, gsize, lsize, *args):
    """Enqueue kernel `name` of `family`; the global size is rounded up to the local size."""
    import pyopencl as cl

    k = kernels(queue, family)[name]
    gsize = tuple(-(-g // l) * l for g, l in zip(gsize, lsize))
    k.set_args(*[_arg(a) for a in args])
    return cl.enqueue_nd_range_kernel(queue, k, gsize, lsize)


def launch1d(queue, family, name, n, *args):
    return launch(queue, family, name, (max(n, 1),), (_LOCAL,), *args)


def new(like_or_queue, shape):
    """An uninitialised device tensor on the queue (or the queue of a tensor)."""
    q = like_or_queue.queue if isinstance(like_or_queue, Tensor) else like_or_queue
    return Tensor.empty(q, shape)


def dummy(queue):
    """A 4-byte buffer for an unused pointer argument."""
    return alloc(queue, 4)


# -- element-wise ------------------------------------------------------------------------
def fill(t, value):
    launch1d(t.queue, "pointwise", "fill", t.size, t.size, t, float(value))
    t.mark_written()


def copy(src, dst):
    launch1d(src.queue, "pointwise", "copy", src.size, src.size, src, dst)
    dst.mark_written()


def axpby(a, x, b, y):
    """y = a*x + b*y"""
    launch1d(x.queue, "pointwise", "axpby", x.size, x.size, float(a), x, float(b), y)
    y.mark_written()


ACT = {"relu": 0, "leaky_relu": 1, "sigmoid": 2, "tanh": 3}


def act_fwd(kind, x, slope=0.0, out=None):
    y = out if out is not None else new(x, x.shape)
    launch1d(x.queue, "pointwise", "act_fwd", x.size, x.size, ACT[kind], float(slope), x, y)
    return y.mark_written()


def act_bwd(kind, saved, dy, slope=0.0):
    dx = new(dy, dy.shape)
    launch1d(dy.queue, "pointwise", "act_bwd", dy.size, dy.size, ACT[kind], float(slope), saved, dy, dx)
    return dx.mark_written()


def mul(a, b):
    y = new(a, a.shape)
    launch1d(a.queue, "pointwise", "mul", a.size, a.size, a, b, y)
    return y.mark_written()


# -- GEMM --------------------------------------------------------------------------------
def gemm(M, N, K, A, sa, B, sb, C, sc, alpha=1.0, beta=0.0, bias=None, bias_mode=0, batch=1,
         offsets=(0, 0, 0)):
    """C[b] = alpha * A[b] @ B[b] + beta * C[b] (+ bias) with element strides
    sa = (m, k, batch), sb = (k, n, batch), sc = (m, n, batch)."""
    q = C.queue
    launch(q, "gemm", "gemm", (-(-N // 4), -(-M // 4), batch), (8, 8, 1),
           M, N, K, A, offsets[0], *sa, B, offsets[1], *sb, C, offsets[2], *sc,
           float(alpha), float(beta), bias if bias is not None else dummy(q), bias_mode)
    return C.mark_written()


def matmul(a, b, trans_a=False, trans_b=False, out=None, beta=0.0, bias=None, bias_mode=0):
    """2-D: out = op(a) @ op(b) (+ beta*out) (+ bias); op transposes by strides, no copy."""
    (ra, ca), (rb, cb) = a.shape, b.shape
    M, K = (ca, ra) if trans_a else (ra, ca)
    K2, N = (cb, rb) if trans_b else (rb, cb)
    if K != K2:
        raise ValueError(f"matmul: inner dimensions differ: {a.shape} x {b.shape}")
    sa = (1, ca, 0) if trans_a else (ca, 1, 0)
    sb = (1, cb, 0) if trans_b else (cb, 1, 0)
    out = out if out is not None else new(a, (M, N))
    return gemm(M, N, K, a, sa, b, sb, out, (N, 1, 0), beta=beta, bias=bias, bias_mode=bias_mode)


def sum_axis(x, I, J, si, sj, out, accumulate=False, off=0):
    """out[j] (+)= sum_i x[off + i*si + j*sj]"""
    launch(x.queue, "gemm", "sum_axis", (J * 64,), (64,), I, J, x, off, si, sj, out, int(accumulate))
    return out.mark_written()


def permute3(src, dims, src_strides, dst, dst_strides, accumulate=False):
    """dst[b*d0 + i*d1 + j*d2] (+)= src[b*s0 + i*s1 + j*s2] over a (B, I, J) walk."""
    B, I, J = dims
    launch(src.queue, "gemm", "permute3", (J, I, B), (16, 4, 1), B, I, J, src, *src_strides, dst, *dst_strides,
           int(accumulate))
    return dst.mark_written()


def accumulate_grad(p, g):
    """p.grad += g (or p.grad = g when there is none yet)."""
    if p.grad is None:
        p.grad = g
    else:
        axpby(1.0, g, 1.0, p.grad)


def grad_target(p):
    """(the parameter's gradient tensor, whether to accumulate into it)."""
    if p.grad is None:
        p.grad = new(p, p.shape)
        return p.grad, False
    return p.grad, True
