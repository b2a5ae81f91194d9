"""FusedPlan: the stages of a Sequential and their device side (executable.py), made on first use
per input shape and kept within bounds; plan_fused(model) makes one when any stage fuses."""
import threading
from collections import OrderedDict
from contextlib import nullcontext

import numpy as np

import netcl.runtime as runtime
from netcl import ops
from netcl.jit.executable import Compiled, Executable
from netcl.jit.stages import LayerStage, plan_stages
from netcl.tensor import Tensor


def plan_fused(model):
    """A FusedPlan for `model` (a Sequential), or None when no stage would fuse."""
    stages, output = plan_stages([layer for _, layer in model.chain()])
    if not any(s.fused for s in stages):
        return None
    return FusedPlan(model, stages, output)


class FusedPlan:
    """Callable: plan(x) -> Tensor, the eval-mode forward of the model through fused kernels.

    Inputs are checked as the layers check them (the same errors and messages); an empty batch
    gives an empty result.

    Per input shape the plan keeps an Executable (kernels with their arguments set, buffers between
    stages, pinned staging), the most recent MAX_EXECUTABLES of them within MAX_BYTES of device
    buffers, and per input shape without the batch a Compiled (programs, weights), the most recent
    MAX_COMPILED: a new batch size builds no program, and memory stays bounded however many batch
    sizes come.

    Threads: one plan (one eval model) may be called from several threads at once, through
    predict() or model(Tensor): a lock makes each call's enqueue-to-result section exclusive, so no
    call sees another's staging buffers or kernel arguments (the device, one in-order queue, runs
    them one after another anyway). Each model(Tensor) call returns its own output tensor.
    Not while other threads run it: train()/eval(), changing weights (load_state_dict, an
    optimizer step) or backward(); training is one thread per model.
    """
    MAX_EXECUTABLES = 8
    MAX_BYTES = 256 << 20
    MAX_COMPILED = 4

    def __init__(self, model, stages, output):
        self.model, self.stages, self.output = model, stages, output
        self._compiled = OrderedDict()  # (queue, input shape without the batch) -> Compiled
        self._exe = OrderedDict()  # (queue, input shape) -> Executable, least recently used first
        self._lock = threading.RLock()
        self._macs = {}  # input shape -> Module.macs: which device predict() uses on a PoCL CPU
        # a layer the plan does not fuse runs its own forward on the call's device, and one with
        # parameters would carry them over to the serial device's context and back: such plans stay
        # (a ColsStage folds its weights onto the call's device: it moves)
        self._movable = not any(isinstance(s, LayerStage) and not s.fused and s.layer.parameters() for s in stages)

    def __repr__(self):
        return f"FusedPlan({', '.join(str(s) for s in self.stages)})"

    def launches(self, x_shape):
        """Kernel launches the plan enqueues per forward for an input of x_shape: one per fused stage
        (conv, linear, residual add, concat copy), whatever the shape, and a column-route conv's
        im2col, GEMM per group and epilogue; a conv or GEMM split over its reduction (split-K) adds
        its reduction's, which this does not count, nor the kernels that unfused layers (unfused())
        enqueue besides."""
        self.model.output_shape(x_shape)
        return sum(s.launches for s in self.stages if s.fused)

    def unfused(self):
        """The layers that run their own forward inside the plan (class names, in order)."""
        return [str(s) for s in self.stages if isinstance(s, LayerStage) and not s.fused]

    def generic_conv_macs(self, q, shape):
        """The multiply-accumulates per sample of the largest conv stage of this plan, for an input of
        `shape` on q, that runs the GPU family's kernel on a CPU device (the planner's fallback for
        shapes its CPU families do not take: a squeeze-excitation gate's 1x1 convs on one pixel, a
        4x4 stride-4 stem); 0 where none does. That kernel is slow there: a GraphModule runs a
        segment past graph.GENERIC_CONV_MACS through its layers (graph.Segment). Builds the plan's
        programs for the shape (tiers.NotReady where they build in the background)."""
        with runtime.serial_lock(q) or nullcontext(), self._lock:
            comp = self._executable(q, tuple(shape)).compiled
        if comp.target.gpu:
            return 0
        return max([s.spec.c * s.spec.k * s.spec.ks * s.spec.ks * s.spec.poh * s.spec.pow for s in comp.steps
                    if getattr(s, "spec", None) is not None and any(f.__name__ == "ConvGpu" for f, _ in s.launches)],
                   default=0)

    def _executable(self, q, shape):
        """The Executable for (q, shape), made (after the layers' own checks) when missing; the
        caller holds the lock. Where the plan's programs for this shape are not built yet and
        kernels build in the background (netcl.runtime.tiers, on a CPU), tiers.NotReady: the caller
        runs the layers' own forwards (_unfused) while the background thread builds them."""
        key = (q.int_ptr, shape)
        exe = self._exe.get(key)
        if exe is not None:
            self._exe.move_to_end(key)
            return exe
        self.model.output_shape(shape)  # the layer path's checks and messages
        ops.check_size(q, shape)
        ckey = (q.int_ptr, shape[1:])
        comp = self._compiled.get(ckey)
        if comp is None:
            if runtime.tiers.mode() == "background" and ops.is_cpu(q):
                try:
                    with runtime.tiers.ready_only():
                        comp = Compiled(self.stages, q, shape)
                except runtime.tiers.NotReady:
                    runtime.tiers.build_later_call(("plan", id(self), ckey), lambda: self._prepare(q, shape))
                    raise
            else:
                comp = Compiled(self.stages, q, shape)
            self._keep(ckey, comp)
        self._compiled.move_to_end(ckey)
        exe = self._exe[key] = Executable(comp, shape, self.output)
        self._trim()
        return exe

    def _keep(self, ckey, comp):
        self._compiled[ckey] = comp
        if len(self._compiled) > self.MAX_COMPILED:
            old, _ = self._compiled.popitem(last=False)
            for k in [k for k in self._exe if (k[0], k[1][1:]) == old]:
                del self._exe[k]

    def _prepare(self, q, shape):
        """(The background thread's) build the plan's programs and weights for `shape`."""
        comp = Compiled(self.stages, q, shape)
        with self._lock:
            if (q.int_ptr, shape[1:]) not in self._compiled:
                self._keep((q.int_ptr, shape[1:]), comp)

    def _unfused(self, x):
        """The eval-mode forward through the layers' own kernels (those of the training routes,
        built already after a training step): where the plan's programs are still building."""
        for _, layer in self.model.chain():
            x = layer(x)
        return x

    def _trim(self):
        """Drop the least recently used executables past the bounds (never the newest)."""
        total = sum(e.nbytes for e in self._exe.values())
        while len(self._exe) > 1 and (len(self._exe) > self.MAX_EXECUTABLES or total > self.MAX_BYTES):
            _, old = self._exe.popitem(last=False)
            total -= old.nbytes

    def _macs_of(self, shape):
        """Module.macs of a call of `shape` (cached), or None when the shape does not fit."""
        macs = self._macs.get(shape)
        if macs is None:
            try:
                macs = self.model.macs(shape)
            except ValueError:  # _executable raises it, with the layers' message
                return None
            if len(self._macs) >= 64:
                self._macs.clear()
            self._macs[shape] = macs
        return macs

    def queue_for(self, shape, queue=None):
        """The queue infer() runs an input of `shape` on: `queue` when given, else the default one, or
        beside PoCL's threaded CPU device its serial one for a call of at most runtime.serial_route()'s
        bound of multiply-accumulates (not when an unfused layer has parameters: _movable)."""
        if queue is not None:
            return queue
        q = runtime.default_queue()
        serial = runtime.serial_route(q) if self._movable else None
        if serial is not None:
            macs = self._macs_of(shape)
            if macs is not None and macs <= serial[1]:
                return serial[0]
        return q

    def infer(self, x, queue=None):
        """Host array in, host array out: the whole round trip (Executable.infer: one upload straight
        from x, the kernels, one read into a pinned buffer).
        Returns a new float32 numpy array; one wait per call.

        The device is queue_for()'s: a small call beside PoCL's threaded CPU device runs on its serial
        one (the kernels run in this thread, none waits for a worker on another core). The same kernel
        families, sized for one core: the reference models' results are equal
        bit for bit; a kernel that splits a reduction across cores may add in another order (float32
        noise). Such a call keeps the GIL while it computes, and calls there take turns."""
        x = np.ascontiguousarray(x, np.float32)
        q = self.queue_for(x.shape, queue)
        if x.size == 0:
            return np.zeros(self.model.output_shape(x.shape), np.float32)
        with runtime.serial_lock(q) or nullcontext(), self._lock:  # on the serial device: one call at a time
            try:
                exe = self._executable(q, x.shape)
            except runtime.tiers.NotReady:  # (on the device the layers' parameters are on, not the serial one)
                home = queue or runtime.default_queue()
                return self._unfused(Tensor.from_host(home, x)).to_host()
            fresh = not exe.staged
            y = exe.infer(x)
            if fresh:
                self._trim()  # its new staging buffers count too
            return y

    def __call__(self, x):
        if x.queue is None:
            x.to(runtime.default_queue())
        if 0 in x.shape:  # (not x.size: np.prod costs microseconds per call)
            return ops.new(x.queue, self.model.output_shape(x.shape))
        with runtime.serial_lock(x.queue) or nullcontext(), self._lock:
            try:
                return self._executable(x.queue, x.shape).run(x)
            except runtime.tiers.NotReady:
                return self._unfused(x)
