"""A plan's device side, in two levels so that a new batch size builds nothing:

    Compiled    per (queue, input shape without the batch): each fused stage set up by its kernel
                family (programs, weight buffers), every family variant a batch size can pick
    Executable  per (queue, input shape): kernel objects with their arguments set (each its own:
                pyopencl kernels carry their arguments), a buffer per value between stages (a
                Concat's output is one buffer its branches write into), and infer()'s two: the
                input buffer it uploads into, the pinned one it reads the result into

Weights are folded on a stage's first use and re-folded when a source tensor's version moves, so
weights changed after eval() (load_state_dict, an optimizer step) are never run stale."""
import os
import time

import numpy as np

import netcl.runtime as runtime
from netcl import ops
from netcl.autograd import inside_layer
from netcl.jit.cols import ColsConv
from netcl.jit.common import STATS, Target
from netcl.jit.config import JitConfig
from netcl.jit.eltwise import AddLaunch, CopyLaunch
from netcl.jit.linear import LinearLaunch
from netcl.jit.seq import (AttentionLaunch, LayerNormLaunch, MaxPoolLaunch, MeanLaunch, TransposeLaunch,
                           UpsampleLaunch)
from netcl.jit.stages import (AddStage, AttentionStage, ColsStage, ConcatStage, ConvStage, CopyStage, LayerNormStage,
                              LayerStage, LinearStage, MeanStage, ResampleStage, TransposeStage, ViewStage, conv_families,
                              conv_family, make_conv)
from netcl.nn.pool import MaxPool2d
from netcl.tensor import Tensor

_POLL_S = 150e-6  # how long infer() polls for its result on CPU devices before it sleeps


# the family of each fused stage but conv and copy stages: made as Launch(target, stage, input shape)
_FAMILIES = {LinearStage: LinearLaunch, AddStage: AddLaunch, LayerNormStage: LayerNormLaunch,
             AttentionStage: AttentionLaunch, MeanStage: MeanLaunch, TransposeStage: TransposeLaunch}


def _family(stage):
    if isinstance(stage, ResampleStage):
        return MaxPoolLaunch if isinstance(stage.layer, MaxPool2d) else UpsampleLaunch
    return _FAMILIES[type(stage)]


class _Step:  # a stage that is not a launch of the plan: a view, an unfused layer, a Concat's output shape
    def __init__(self, stage):
        self.stage = stage

    def __call__(self, x):  # an unfused layer's forward
        return self.stage.layer(x)


class _Fused:  # a fused stage: its launches by (family, tile) (one key, None, for the other families)
    def __init__(self, stage, spec, launches):
        self.stage, self.spec, self.launches = stage, spec, launches


class Compiled:
    """The programs and weight buffers of a plan's stages for one (queue, input shape without the
    batch); `shape` is the first input shape asked for, whose sizes are checked before any build."""

    def __init__(self, stages, q, shape):
        config = JitConfig.from_env()
        self.target = target = Target(q, (config.jit_class or runtime.device_class(q)) == "gpu", config)
        self.q = q
        self.dummy = target.buffer(4)  # the residual argument of a stage without one
        self.steps = []  # _Step or _Fused, in order
        n, shapes, koff = shape[0], {0: tuple(shape)}, {}
        for st in stages:
            src = shapes[st.src]
            if isinstance(st, ConcatStage):  # the output's shape and each branch's slice
                out = shapes[st.dst] = st.layer.output_shape(src)
                d, off = st.layer._axis(len(out)), 0
                for branch, writer in zip(st.layer.branches.layers, st.writers):
                    koff[id(writer)] = off
                    off += branch.output_shape(src)[d]
                self.steps.append(_Step(st))
                continue
            if isinstance(st, (ViewStage, LayerStage)):  # a ColsStage runs through netcl.ops as a layer does
                shapes[st.dst] = st.layer.output_shape(src)
                self.steps.append(ColsConv(st, q) if isinstance(st, ColsStage) else _Step(st))
                continue
            spec = None
            if isinstance(st, ConvStage):
                whole = shapes.get(st.dst)  # set when the conv writes a slice of a Concat's output
                spec = st.spec(src, whole[1] if whole is not None else 0, koff.get(id(st), 0))
                ops.check_size(q, spec.out_shape(n), spec.out_bytes(n))  # before a build, as the layer path would
                launches = {ft: make_conv(target, spec, ft) for ft in conv_families(spec, target, st.depthwise)}
                out = spec.out_shape(n)
            elif isinstance(st, CopyStage):
                launch = CopyLaunch(target, st, shapes[st.dst], koff[id(st)])
                out, launches = src, {None: launch}
            else:
                launch = _family(st)(target, st, src)
                out, launches = launch.sized(target, src)[2], {None: launch}
            ops.check_size(q, out)
            shapes.setdefault(st.dst, out)
            self.steps.append(_Fused(st, spec, launches))


class _Bound:
    """One kernel launch of a fused stage in an Executable (a stage has one, or more: Launch.passes):
    its kernel, and the values its buffer arguments read and write (bound per call when the value's
    buffer changed: the plan's input, an unfused layer's output, the model's output)."""

    def __init__(self, step, launch, name, kernel, args, gsize, binds):
        self.stage, self.launch, self.name, self.kernel, self.gsize = step.stage, launch, name, kernel, gsize
        self.args = args  # held: a kernel argument does not keep its buffer alive
        self.lsize, self.binds = launch.lsize, binds
        self.bound = [None] * len(binds)


class Executable:
    """A Compiled plan bound for one input shape: kernels with their fixed arguments set, a buffer
    per value between stages (made here), pinned staging for infer() (made on its first call)."""

    def __init__(self, compiled, shape, output):
        target = self.target = compiled.target
        cl, q = target.cl, compiled.q
        self.q, self.shape, self.compiled = q, tuple(shape), compiled
        n, shapes, nbytes, sized = shape[0], {0: tuple(shape)}, {}, []
        root = {0: 0}  # value -> the value whose buffer holds it (a view's is its source's)
        writers = {}  # value -> "fused" or "layer"
        for step in compiled.steps:  # every size first: nothing is allocated for a shape that does not fit
            st = step.stage
            src = shapes[st.src]
            if isinstance(step, _Fused):
                launch = step.launches[conv_family(step.spec, target, n, st.depthwise) if step.spec else None]
                args, gsize, out_shape, out_bytes = launch.sized(target, src)
                ops.check_size(q, out_shape, out_bytes)
                shapes.setdefault(st.dst, out_shape)
                nbytes[st.dst] = max(nbytes.get(st.dst, 0), out_bytes)
                root[st.dst], writers[st.dst] = st.dst, "fused"
                sized.append((step, launch, args, gsize))
                continue
            shapes[st.dst] = st.layer.output_shape(src)
            if isinstance(st, ViewStage):
                root[st.dst] = root[st.src]
            elif isinstance(st, LayerStage):
                root[st.dst], writers[st.dst] = st.dst, "layer"
            sized.append((step, None, None, None))
        self.out_shape, self.out_root = shapes[output], root[output]
        self.out_bytes = nbytes.get(self.out_root, 0)
        # per value, its buffer: made here for those the plan's kernels write; the model's output is a
        # fresh tensor per call; the plan's input and unfused layers' outputs arrive per call
        self.bufs, self.nbytes = [None] * (max(root) + 1), 0
        for v, kind in writers.items():
            if kind == "fused" and v != self.out_root:
                border = next(s.stage.out_border for s, *_ in sized if isinstance(s, _Fused) and s.stage.dst == v)
                self.bufs[v] = target.buffer(nbytes[v], zero=border > 0)
                self.nbytes += nbytes[v]
        self.steps = []  # _Bound, or a LayerStage's _Step or ColsConv (views and Concats need nothing at run time)
        self.shapes, self.root = shapes, root
        for step, launch, args, gsize in sized:
            st = step.stage
            if launch is None:
                if isinstance(st, LayerStage):
                    self.steps.append(step)
                continue
            binds = [(launch.in_arg, root[st.src]), (launch.out_arg, st.dst)]
            if launch.res_arg is not None:
                if st.res is not None:
                    binds.append((launch.res_arg, root[st.res]))
                else:
                    args[launch.res_arg] = compiled.dummy
            for name, size in launch.passes(args, gsize):
                kernel = cl.Kernel(launch.program, name)
                for j, a in enumerate(args):
                    if a is not None:
                        kernel.set_arg(j, a)
                self.steps.append(_Bound(step, launch, name, kernel, args, size, list(binds)))
        self.fused = [s for s in self.steps if isinstance(s, _Bound)]
        self.launches = len(self.fused) + sum(s.stage.launches for s in self.steps if isinstance(s, ColsConv))
        self._sources = [t for s in self.fused for t in s.stage.sources]
        self._versions = None  # of _sources, when this executable last made sure its weights were current
        self.staged = False  # infer()'s buffers made

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
        """A pinned output buffer (mapped once) that the result is read into, and the device input
        buffer infer() uploads into."""
        cl, q = self.target.cl, self.q
        mf = cl.mem_flags
        nin = int(np.prod(self.shape)) * 4
        nout = int(np.prod(self.out_shape)) * 4
        self.pin_out = cl.Buffer(q.context, mf.READ_WRITE | mf.ALLOC_HOST_PTR, max(nout, 4))
        STATS["buffers"] += 1
        self.host_out, _ = cl.enqueue_map_buffer(q, self.pin_out, cl.map_flags.WRITE | cl.map_flags.READ, 0,
                                                 self.out_shape, np.float32)
        self.nbytes += nin + nout
        self.staged = True
        self.dev_in = Tensor(self.shape, q, self.target.buffer(nin))

    def infer(self, x):
        """The round trip for a host array `x` of this executable's shape: upload, run, read -> numpy."""
        cl, q = self.target.cl, self.q
        if not self.staged:
            self._staging()
        # the driver's own upload from the caller's pageable array: faster than copying into a pinned
        # buffer first on NVIDIA, and than mapping a pinned input buffer on PoCL (docs/performance.md)
        cl.enqueue_copy(q, self.dev_in.buf, x, is_blocking=True)
        return self._finish(self.run(self.dev_in))

    def _finish(self, y):
        cl = self.target.cl
        if self.target.gpu:
            cl.enqueue_copy(self.q, self.host_out, y.buf, is_blocking=True)
        else:
            # on CPU devices the calling thread first polls for the read, yielding its core to
            # PoCL's workers between polls, instead of sleeping in a blocking read: waking a sleeping
            # thread costs more than a small model's forward. Past _POLL_S it sleeps: polling longer
            # takes time from the workers (docs/performance.md).
            done = cl.enqueue_copy(self.q, self.host_out, y.buf, is_blocking=False)
            self.q.flush()
            complete, until = cl.command_execution_status.COMPLETE, time.perf_counter() + _POLL_S
            while done.command_execution_status > complete and time.perf_counter() < until:
                os.sched_yield()
            done.wait()  # at once when complete; raises if the command failed
        return self.host_out.copy()

    def run(self, x):
        """Enqueue the plan on device Tensor `x` (weights refolded where they changed) -> the output Tensor."""
        self.refresh()
        q = self.q
        bufs = list(self.bufs)
        bufs[0] = x.buf
        held, out = [], None  # unfused layers' outputs, alive until the call ends; the model's output
        if self.out_bytes:
            out = Tensor(self.out_shape, q, runtime.alloc(q, self.out_bytes))
            bufs[self.out_root] = out.buf
        enqueue = self.target.cl.enqueue_nd_range_kernel
        for s in self.steps:
            if isinstance(s, _Bound):
                for i, (j, v) in enumerate(s.binds):
                    b = bufs[v]
                    if s.bound[i] is not b:
                        s.kernel.set_arg(j, b)
                        s.bound[i] = b
                enqueue(q, s.kernel, s.gsize, s.lsize)
            else:  # an unfused layer or a ColsStage: Tensors in and out (inference: nothing for autograd)
                st = s.stage
                with inside_layer:
                    y = s(Tensor(self.shapes[st.src], q, bufs[self.root[st.src]]))
                held.append(y)
                bufs[st.dst] = y.buf
                if st.dst == self.out_root:
                    out = y
        STATS["launches"] += self.launches
        if out is None:  # the output is the input, or a view of it
            return Tensor(self.out_shape, q, bufs[self.out_root]).mark_written()
        if out.shape != self.out_shape:  # views after the last stage
            out = out.reshape(self.out_shape)
        return out.mark_written()
