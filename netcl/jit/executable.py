"""A plan's device side for one (context, input shape): each fused stage set up by its kernel
family, buffers bound between stages, weights re-folded when a source tensor's version moves,
and the launches; infer() adds pinned staging buffers for a host-to-host round trip."""
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import netcl.runtime as runtime
from netcl.jit.common import STATS, Launch, Target
from netcl.jit.config import JitConfig
from netcl.jit.linear import LinearLaunch
from netcl.jit.stages import ConvStage, LayerStage, ViewStage, conv_family
from netcl.tensor import Tensor

_pool = None


def _copy_pool():
    """Threads for host copies into pinned staging memory (numpy releases the GIL while copying)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max(1, min(8, (os.cpu_count() or 1))), thread_name_prefix="netcl-copy")
    return _pool


class _View:  # the next step reads the same buffer as this shape
    def __init__(self, shape):
        self.shape = shape


class _Layer:  # an unfused layer: Tensor in, Tensor out
    def __init__(self, layer):
        self.layer = layer


class Executable:
    def __init__(self, stages, q, shape):
        config = JitConfig.from_env()
        gpu = (config.jit_class or runtime.device_class(q)) == "gpu"
        self.target = Target(q, gpu, config)
        self.q, self.shape = q, tuple(shape)
        self.steps = []  # Launch, _View or _Layer, in order
        self._weights = []  # (stage, its Launch): refreshed together
        shape, in_border = tuple(shape), 0
        for idx, st in enumerate(stages):
            if isinstance(st, ViewStage):
                shape = st.layer.output_shape(shape)
                self.steps.append(_View(shape))
                continue
            if isinstance(st, LayerStage):
                shape = st.layer.output_shape(shape)
                self.steps.append(_Layer(st.layer))
                in_border = 0
                continue
            if isinstance(st, ConvStage):
                # the output carries the zero border that the conv it feeds directly reads
                nxt = stages[idx + 1] if idx + 1 < len(stages) else None
                out_border = nxt.conv.padding if isinstance(nxt, ConvStage) else 0
                spec = st.spec(shape, in_border, out_border)
                launch = conv_family(spec, self.target)(self.target, spec)
                in_border = out_border
            else:
                launch = LinearLaunch(self.target, st, shape)
                in_border = 0
            shape = launch.out_shape
            self.steps.append(launch)
            self._weights.append((st, launch))
        self.out_shape = shape
        self._sources = [t for st, _ in self._weights for t in st.sources]
        self._versions = None
        self._bound = False
        self.host_in = None
        self.refresh(force=True)

    # -- weights -------------------------------------------------------------------------
    def refresh(self, force=False):
        """Re-fold and upload the weights of every stage whose source tensors changed."""
        vers = [(id(t), t.version) for t in self._sources]
        if not force and vers == self._versions:
            return
        cl, q = self.target.cl, self.q
        STATS["folds"] += 1
        for st, launch in self._weights:
            host_w, host_b = launch.pack(*st.folded())
            cl.enqueue_copy(q, launch.w_buf, host_w, is_blocking=True)
            cl.enqueue_copy(q, launch.b_buf, host_b, is_blocking=True)
        self._versions = vers

    # -- running -------------------------------------------------------------------------
    def _bind(self):
        """Set every kernel's fixed arguments and make the buffers between stages (first call)."""
        # the stage whose buffer is the model's output (only views after it) writes a fresh tensor
        tail = len(self.steps)
        while tail > 0 and isinstance(self.steps[tail - 1], _View):
            tail -= 1
        last = self.steps[tail - 1] if tail else None
        for s in self.steps:
            if not isinstance(s, Launch):
                continue
            # the model output: a fresh pool buffer per call
            s.out_buf = None if s is last else self.target.buffer(s.out_bytes, zero=s.out_border > 0)
            for i, a in enumerate(s.args):
                if a is not None:
                    s.kernel.set_arg(i, a)
            if s.out_buf is not None:
                s.kernel.set_arg(s.out_arg, s.out_buf)
            s.bound_in = None
        self._bound = True

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
        if not self._bound:
            self._bind()
        self.refresh()
        q = self.q
        cur, cur_shape = x.buf, x.shape
        out_tensor = None
        enqueue = self.target.cl.enqueue_nd_range_kernel
        n_launch = 0
        for s in self.steps:
            if isinstance(s, Launch):
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
                n_launch += 1
                cur_shape = s.out_shape
            elif isinstance(s, _View):
                cur_shape = s.shape
            else:  # an unfused layer: it takes and returns Tensors
                t = Tensor(cur_shape, q, cur) if not isinstance(cur, Tensor) else cur
                y = s.layer(t)
                cur, cur_shape = y.buf, y.shape
                out_tensor = y
        STATS["launches"] += n_launch
        if out_tensor is None or out_tensor.buf is not cur:
            out_tensor = Tensor(cur_shape, q, cur)  # ends in a view of an intermediate (rare)
        elif out_tensor.shape != cur_shape:
            out_tensor = out_tensor.reshape(cur_shape)
        return out_tensor.mark_written()
