"""A plan's device side, in two levels so that a new batch size builds nothing:

    Compiled    per (queue, input shape without the batch): each fused stage set up by its kernel
                family (programs, weight buffers), every family variant a batch size can pick
    Executable  per (queue, input shape): kernel objects with their arguments set (each its own:
                pyopencl kernels carry their arguments), the buffers between stages, and the
                pinned staging buffers of infer()

Weights are folded on a stage's first use and re-folded when a source tensor's version moves, so
weights changed after eval() (load_state_dict, an optimizer step) are never run stale."""
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import netcl.runtime as runtime
from netcl import ops
from netcl.jit.common import STATS, Target
from netcl.jit.config import JitConfig
from netcl.jit.linear import LinearLaunch
from netcl.jit.stages import ConvStage, LayerStage, ViewStage, conv_families, conv_family, make_conv
from netcl.tensor import Tensor

_pool = None
_pool_lock = threading.Lock()


def _copy_pool():
    """Threads for host copies into pinned staging memory (numpy releases the GIL while copying)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, min(8, (os.cpu_count() or 1))), thread_name_prefix="netcl-copy")
    return _pool


class _View:  # a view (Flatten): the next step reads the same buffer
    def __init__(self, layer):
        self.layer = layer


class _Layer:  # an unfused layer: Tensor in, Tensor out
    def __init__(self, layer):
        self.layer = layer


class _Fused:  # a fused stage: its launches by (family, tile) (one key, None, for a linear stage)
    def __init__(self, stage, spec, launches):
        self.stage, self.spec, self.launches = stage, spec, launches


class Compiled:
    """The programs and weight buffers of a plan's stages for one (queue, input shape without the
    batch); `shape` is the first input shape asked for, whose sizes are checked before any build."""

    def __init__(self, stages, q, shape):
        config = JitConfig.from_env()
        self.target = target = Target(q, (config.jit_class or runtime.device_class(q)) == "gpu", config)
        self.q = q
        self.steps = []  # _View, _Layer or _Fused, in order
        n, in_border = shape[0], 0
        for idx, st in enumerate(stages):
            if isinstance(st, (ViewStage, LayerStage)):
                shape = st.layer.output_shape(shape)
                self.steps.append((_View if isinstance(st, ViewStage) else _Layer)(st.layer))
                in_border = in_border if isinstance(st, ViewStage) else 0
                continue
            if isinstance(st, ConvStage):
                # the output carries the zero border that the conv it feeds directly reads
                nxt = stages[idx + 1] if idx + 1 < len(stages) else None
                out_border = nxt.conv.padding if isinstance(nxt, ConvStage) else 0
                spec = st.spec(shape, in_border, out_border)
                ops.check_size(q, spec.out_shape(n), spec.out_bytes(n))  # before a build, as the layer path would
                launches = {ft: make_conv(target, spec, ft) for ft in conv_families(spec, target)}
                shape, in_border = spec.out_shape(n), out_border
            else:
                spec, shape = None, st.lin.output_shape(shape)
                ops.check_size(q, shape)
                launches, in_border = {None: LinearLaunch(target, st)}, 0
            self.steps.append(_Fused(st, spec, launches))


class _Bound:
    """One fused stage's launch in an Executable."""

    def __init__(self, step, launch, kernel, args, gsize, out_shape, out_bytes, out_buf):
        self.stage, self.launch, self.kernel, self.gsize = step.stage, launch, kernel, gsize
        self.args = args  # held: a kernel argument does not keep its buffer alive
        self.lsize, self.in_arg, self.out_arg = launch.lsize, launch.in_arg, launch.out_arg
        self.out_shape, self.out_bytes, self.out_buf = out_shape, out_bytes, out_buf
        self.bound_in = None


class Executable:
    """A Compiled plan bound for one input shape: kernels with their fixed arguments set, the buffers
    between stages (made here), pinned staging for infer() (made on its first call)."""

    def __init__(self, compiled, shape):
        target = self.target = compiled.target
        cl, q = target.cl, compiled.q
        self.q, self.shape, self.compiled = q, tuple(shape), compiled
        n, sized = shape[0], []
        for step in compiled.steps:  # every size first: nothing is allocated for a shape that does not fit
            if isinstance(step, _Fused):
                launch = step.launches[conv_family(step.spec, target, n) if step.spec else None]
                args, gsize, out_shape, out_bytes = launch.sized(target, shape)
                ops.check_size(q, out_shape, out_bytes)
                sized.append((step, launch, args, gsize, out_shape, out_bytes))
            else:
                sized.append((step, None, None, None, step.layer.output_shape(shape), 0))
            shape = sized[-1][4]
        self.out_shape = tuple(shape)
        # the stage whose buffer is the model's output (only views after it) writes a fresh tensor per call
        tail = len(sized)
        while tail > 0 and isinstance(sized[tail - 1][0], _View):
            tail -= 1
        self.steps, self.nbytes = [], 0  # _Bound, _View (with its output shape) or _Layer; device bytes held
        for i, (step, launch, args, gsize, out_shape, out_bytes) in enumerate(sized):
            if launch is None:
                self.steps.append((out_shape, step) if isinstance(step, _View) else step)
                continue
            kernel = cl.Kernel(launch.program, launch.name)
            for j, a in enumerate(args):
                if a is not None:
                    kernel.set_arg(j, a)
            out_buf = None
            if i != tail - 1:
                out_buf = target.buffer(out_bytes, zero=launch.out_border > 0)
                kernel.set_arg(launch.out_arg, out_buf)
                self.nbytes += out_bytes
            self.steps.append(_Bound(step, launch, kernel, args, gsize, out_shape, out_bytes, out_buf))
        self.fused = [s for s in self.steps if isinstance(s, _Bound)]
        self._sources = [t for s in self.fused for t in s.stage.sources]
        self._versions = None  # of _sources, when this executable last made sure its weights were current
        self.host_in = None

    def refresh(self):
        """Fold and upload the weights of every stage whose source tensors changed (one version list
        per call; the launches, shared with other executables, know what they last uploaded)."""
        vers = [t.version for t in self._sources]
        if vers != self._versions:
            for s in self.fused:
                s.launch.refresh(self.target, s.stage)
            self._versions = vers

    # -- running (the caller, FusedPlan, holds its lock) ---------------------------------------
    def _staging(self):
        """Pinned host buffers (mapped once) and a device input buffer for infer()."""
        cl, q = self.target.cl, self.q
        mf = cl.mem_flags
        nin = int(np.prod(self.shape)) * 4
        nout = int(np.prod(self.out_shape)) * 4
        self.pin_in = cl.Buffer(q.context, mf.READ_WRITE | mf.ALLOC_HOST_PTR, nin)
        self.pin_out = cl.Buffer(q.context, mf.READ_WRITE | mf.ALLOC_HOST_PTR, max(nout, 4))
        STATS["buffers"] += 2
        self.host_in, _ = cl.enqueue_map_buffer(q, self.pin_in, cl.map_flags.WRITE | cl.map_flags.READ, 0,
                                                self.shape, np.float32)
        self.host_out, _ = cl.enqueue_map_buffer(q, self.pin_out, cl.map_flags.WRITE | cl.map_flags.READ, 0,
                                                 self.out_shape, np.float32)
        self.dev_in = Tensor(self.shape, q, self.target.buffer(nin))
        self.nbytes += 2 * nin + nout
        flat = self.host_in.reshape(-1)
        step = max(1 << 18, -(-flat.size // 8))  # >= 1 MB chunks, at most 8
        self.chunks = [(i, min(i + step, flat.size)) for i in range(0, flat.size, step)]

    def infer(self, x):
        cl, q = self.target.cl, self.q
        if self.host_in is None:
            self._staging()
        src, dst = x.reshape(-1), self.host_in.reshape(-1)
        if len(self.chunks) > 1:  # copy chunks into pinned memory on several threads; send each when ready
            pool = _copy_pool()
            done = [pool.submit(np.copyto, dst[a:b], src[a:b]) for a, b in self.chunks]
        for i, (a, b) in enumerate(self.chunks):
            if len(self.chunks) > 1:
                done[i].result()
            else:
                np.copyto(dst[a:b], src[a:b])
            cl.enqueue_copy(q, self.dev_in.buf, dst[a:b], dst_offset=4 * a, is_blocking=False)
        y = self.run(self.dev_in)
        cl.enqueue_copy(q, self.host_out, y.buf, is_blocking=True)
        return self.host_out.copy()

    def run(self, x):
        self.refresh()
        q = self.q
        cur, cur_shape = x.buf, x.shape
        out_tensor = None
        enqueue = self.target.cl.enqueue_nd_range_kernel
        for s in self.steps:
            if isinstance(s, _Bound):
                if s.bound_in is not cur:
                    s.kernel.set_arg(s.in_arg, cur)
                    s.bound_in = cur
                if s.out_buf is None:
                    out_tensor = Tensor(s.out_shape, q, runtime.alloc(q, s.out_bytes))
                    s.kernel.set_arg(s.out_arg, out_tensor.buf)
                    cur = out_tensor.buf
                else:
                    cur = s.out_buf
                enqueue(q, s.kernel, s.gsize, s.lsize)
                cur_shape = s.out_shape
            elif isinstance(s, _Layer):  # an unfused layer: it takes and returns Tensors
                t = Tensor(cur_shape, q, cur) if not isinstance(cur, Tensor) else cur
                y = s.layer(t)
                cur, cur_shape = y.buf, y.shape
                out_tensor = y
            else:  # (shape, _View)
                cur_shape = s[0]
        STATS["launches"] += len(self.fused)
        if out_tensor is None or out_tensor.buf is not cur:
            out_tensor = Tensor(cur_shape, q, cur)  # ends in a view of an intermediate (rare)
        elif out_tensor.shape != cur_shape:
            out_tensor = out_tensor.reshape(cur_shape)
        return out_tensor.mark_written()
