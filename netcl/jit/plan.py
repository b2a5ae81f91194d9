"""FusedPlan: the stages of a Sequential and, per (context, input shape), an Executable made on
first use; plan_fused(model) makes one when any stage fuses."""
import numpy as np

import netcl.runtime as runtime
from netcl.jit.executable import Executable
from netcl.jit.stages import plan_stages


def plan_fused(model):
    """A FusedPlan for `model` (a Sequential), or None when no stage would fuse."""
    stages = plan_stages([layer for _, layer in model.chain()])
    if not any(s.fused for s in stages):
        return None
    return FusedPlan(model, stages)


class FusedPlan:
    """Callable: plan(x) -> Tensor, the eval-mode forward of the model through fused kernels."""

    def __init__(self, model, stages):
        self.model, self.stages = model, stages
        self._exe = {}  # (context, input shape) -> Executable

    def __repr__(self):
        return f"FusedPlan({', '.join(str(s) for s in self.stages)})"

    def launches(self, x_shape):
        """Kernel launches per forward for an input of x_shape (fused stages only)."""
        return sum(1 for s in self.stages if s.fused)

    def _executable(self, q, shape):
        key = (q.context.int_ptr, shape)
        exe = self._exe.get(key)
        if exe is None:
            exe = self._exe[key] = Executable(self.stages, q, shape)
        return exe

    def infer(self, x, queue=None):
        """Host array in, host array out: the whole round trip through pinned staging buffers
        (the upload is cut in chunks so that copying into pinned memory overlaps the transfer).
        Returns a new float32 numpy array; one wait per call."""
        q = queue if queue is not None else runtime.default_queue()
        x = np.ascontiguousarray(x, np.float32)
        return self._executable(q, x.shape).infer(x)

    def __call__(self, x):
        if x.queue is None:
            x.to(runtime.default_queue())
        return self._executable(x.queue, x.shape).run(x)
