"""Element-wise chains: several element-wise tensor operations of one output shape (add, sub, mul,
div, maximum, minimum, neg, exp and the activations of kernels/act.h) run as one generated kernel,
where eager execution launches one kernel per operation and writes every intermediate to memory.

A Chain is device-free: its steps, each an operation on earlier steps, on the chain's inputs
(tensors) or on its scalars (Python numbers, passed as kernel arguments so a new number builds
nothing). An input of the output's shape is read at the element's index; any other is one whose
sizes that are not 1 are a contiguous run of the output's dimensions (a per-channel (1, C, 1, 1),
a squeeze-excitation gate (N, C, 1, 1), a trailing (C,), a scalar tensor), read at
(i / div) % mod. The kernel's text comes from _TEMPLATE, filled from the step list, and is built
through netcl.runtime's program cache (memory and disk); kernel objects are kept per (context, the
chain's signature: its steps and which inputs broadcast), the MAX_VARIANTS most recently used. A new
number or shape builds nothing: the variants are those of the op lists a process runs.

The formulas are tensor.cl's and act.h's, with floating-point contraction off, so a chain gives
what its operations one by one give (NaN and the infinities included)."""
import threading
from collections import OrderedDict

import numpy as np

import netcl.runtime as runtime
from netcl import ops
from netcl.act import Act

# operation -> its formula on operands {a}, {b} (tensor.cl's F2/F1); activations: act.h's ACT_APPLY
BINARY = {"add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
          "maximum": "((({a}) > ({b}) || ({a}) != ({a})) ? ({a}) : ({b}))",
          "minimum": "((({a}) < ({b}) || ({a}) != ({a})) ? ({a}) : ({b}))"}
UNARY = {"neg": "(-{a})", "exp": "exp({a})"}
MAX_VARIANTS = 256
MAX_INPUTS = 16
_GPU_LOCAL = 64

# --- the kernel template: CHAIN_PARAMS, CHAIN_LOADS16, CHAIN_BODY16 (float16 vectors: PoCL vectorises
# explicit vector code, not loops of scalars), CHAIN_LOADS and CHAIN_BODY are filled from the steps ---
_TEMPLATE = """#pragma OPENCL FP_CONTRACT OFF
#include "act.h"

// y[i] = the chain's last step at element i: CPUs a chunk of elements (a multiple of 16, as
// ops.cpu_chunk makes it) per work-item in float16 vectors, GPUs one element per work-item
__kernel void chain(const int n, const int chunk, __global float *y CHAIN_PARAMS) {
#ifdef CPU
    const int i0 = get_global_id(0) * chunk;
    const int i1 = min(n, i0 + chunk);
    int i = i0;
    for (; i + 16 <= i1; i += 16) {
CHAIN_LOADS16
CHAIN_BODY16
    }
    for (; i < i1; i++) {
#else
    const int i = get_global_id(0);
    if (i < n) {
#endif
CHAIN_LOADS
CHAIN_BODY
    }
}
"""
class Chain:
    """Steps ((op, operands), ...) in order, the last the chain's value. An operand is ("in", k)
    (the k-th input tensor), ("t", j) (step j's value) or ("s", k) (the k-th scalar); op is a key of
    BINARY or UNARY, or ("act", code) for an activation whose slope is its second operand."""

    def __init__(self, steps, n_inputs, n_scalars):
        if not 0 < n_inputs <= MAX_INPUTS:
            raise ValueError(f"a chain takes 1 to {MAX_INPUTS} input tensors, got {n_inputs}")
        self.steps, self.n_inputs, self.n_scalars = tuple(steps), n_inputs, n_scalars

    def signature(self, kinds):
        """What the kernel's text depends on: the steps and which inputs broadcast (kinds: 'f' or 'b')."""
        return repr((self.steps, self.n_scalars, tuple(kinds)))

    def source(self, kinds):
        """The kernel's OpenCL C for inputs of these kinds ('f' at the output's index, 'b' broadcast)."""
        params, loads, loads16 = [], [], []
        for k, kind in enumerate(kinds):
            params.append(f"__global const float *x{k}")
            if kind == "b":
                params.append(f"const int d{k}, const int m{k}")
                loads.append(f"        const float a{k} = x{k}[(i / d{k}) % m{k}];")
                # one value for all 16 lanes where they fall in one run of d (a gate over H x W), else gathered
                gather = ", ".join(f"x{k}[((i + {j}) / d{k}) % m{k}]" for j in range(16))
                loads16.append(f"        float16 a{k};\n        if (i / d{k} == (i + 15) / d{k}) a{k} = "
                               f"(float16)(x{k}[(i / d{k}) % m{k}]);\n        else a{k} = (float16)({gather});")
            else:
                loads.append(f"        const float a{k} = x{k}[i];")
                loads16.append(f"        const float16 a{k} = vload16(0, x{k} + i);")
        params += [f"const float s{k}" for k in range(self.n_scalars)]
        text = _TEMPLATE.replace("CHAIN_PARAMS", "".join(", " + p for p in params))
        text = text.replace("CHAIN_LOADS16", "\n".join(loads16)).replace("CHAIN_LOADS", "\n".join(loads))
        last = len(self.steps) - 1
        text = text.replace("CHAIN_BODY16", self._body("float16") + f"\n        vstore16(t{last}, 0, y + i);")
        return text.replace("CHAIN_BODY", self._body("float") + f"\n        y[i] = t{last};")

    def _body(self, t):
        """The steps as statements on values of type t (float or float16)."""
        name = {"in": "a{}", "t": "t{}", "s": f"(({t})s{{}})"}
        body = []
        for j, (op, operands) in enumerate(self.steps):
            v = [name[kind].format(k) for kind, k in operands]
            if isinstance(op, tuple):  # ("act", code): ACT_APPLY folds to the one formula
                expr = f"ACT_APPLY({int(op[1])}, {v[0]}, {v[1] if len(v) > 1 else '0.0f'})"
            elif op in BINARY:
                expr = BINARY[op].format(a=v[0], b=v[1])
            else:
                expr = UNARY[op].format(a=v[0])
            body.append(f"        const {t} t{j} = {expr};")
        return "\n".join(body)


def broadcast_index(shape, out):
    """(div, mod) reading a tensor of `shape` at output element i of `out` as (i / div) % mod, or None
    where its sizes that are not 1 are no contiguous run of out's trailing-aligned dimensions."""
    shape = tuple(shape)
    if len(shape) > len(out):
        return None
    shape = (1,) * (len(out) - len(shape)) + shape
    kept = [d for d, s in enumerate(shape) if s != 1]
    if any(s != 1 and s != o for s, o in zip(shape, out)):
        return None
    if not kept:
        return 1, 1
    lo, hi = kept[0], kept[-1] + 1
    if any(shape[d] != out[d] for d in range(lo, hi)):
        return None
    return int(np.prod(out[hi:], dtype=np.int64)), int(np.prod(out[lo:hi], dtype=np.int64))


_kernels = OrderedDict()  # (context, signature, cpu) -> kernel, the most recently used last
_lock = threading.Lock()
STATS = {"built": 0}


def _kernel(q, chain, kinds):
    cpu = ops.is_cpu(q)
    key = (q.context, chain.signature(kinds), cpu)
    with _lock:
        hit = _kernels.get(key)
        if hit is not None:
            _kernels.move_to_end(key)
            return hit
    source = runtime.program.with_headers(chain.source(kinds))
    options = ("-DCPU",) if cpu else ()
    prog = runtime.build(q.context, source, options, family="chain", what="an element-wise chain")
    import pyopencl as cl

    k = cl.Kernel(prog, "chain")
    k.set_scalar_arg_dtypes(runtime.arg_dtypes(source)["chain"])
    with _lock:
        STATS["built"] += 1
        _kernels[key] = k
        while len(_kernels) > MAX_VARIANTS:
            _kernels.popitem(last=False)
    return k


def run(chain, inputs, scalars, out_shape):
    """The chain's value (a new Tensor of out_shape) from its input Tensors (float32) and scalars; None
    where the inputs are not on one queue, or an input's shape is neither out_shape nor broadcast as
    broadcast_index reads (the caller then runs the operations one by one)."""
    out_shape = tuple(int(s) for s in out_shape)
    kinds, index = [], []
    for t in inputs:
        if tuple(t.shape) == out_shape:
            kinds.append("f")
            index.append(())
            continue
        di = broadcast_index(t.shape, out_shape)
        if di is None:
            return None
        kinds.append("b")
        index.append(di)
    q = inputs[0].queue
    if q is None or any(t.queue is not q for t in inputs):
        return None
    y = ops.new(q, out_shape)
    n = int(np.prod(out_shape, dtype=np.int64))
    if n == 0:
        return y.mark_written()
    k = _kernel(q, chain, kinds)
    args = [n, 0, y]
    for t, di in zip(inputs, index):
        args.append(t)
        args += list(di)
    args += [float(s) for s in scalars]
    if ops.is_cpu(q):
        chunk, items = ops.cpu_chunk(n)
        args[1] = chunk
        ops._enqueue(q, k, (items,), (1,), args)
    else:
        ops._enqueue(q, k, (-(-n // _GPU_LOCAL) * _GPU_LOCAL,), (_GPU_LOCAL,), args)
    return y.mark_written()


def act_step(code, operand, slope=None):
    """The step of activation `code` (netcl.act.Act) on operand, its slope a scalar operand."""
    return (("act", int(Act(code))), (operand,) if slope is None else (operand, slope))
