"""What every kernel family shares: the STATS counters, the Target a family builds for (program
builds and device buffers go through it, so STATS counts them), Launch (the interface a family
implements) and, from netcl.convspec (below the layers, which run conv_winot.cl in training too),
ConvSpec (one conv stage's sizes and common -D defines, kernels/conv.h) and act_defines.

The batch size is never a define: a family's program and weights serve every batch size, and
only its launch arguments and global size depend on it (Launch.sized)."""
import numpy as np

import netcl.runtime as runtime  # module attributes: tests patch runtime.build
from netcl.convspec import ConvSpec, act_defines  # noqa: F401 (the families import them from here)

# counters for tests and benchmarks: program builds, device buffers made, kernels launched, weight folds
STATS = {"builds": 0, "buffers": 0, "launches": 0, "folds": 0}
_programs = {}  # (Context, family, options) -> pyopencl.Program; bounded by the layers and image sizes seen


class Target:
    """The device one executable builds for: queue, kernel class (gpu or not), compute units, the
    preferred float vector width and the tuning config (netcl.jit.config.JitConfig)."""

    def __init__(self, q, gpu, config):
        import pyopencl as cl

        self.cl, self.q, self.gpu, self.config = cl, q, gpu, config
        self.n_cu = q.device.max_compute_units
        self.vector_width = runtime.float_lanes(q.device)  # PoCL: 16 on AVX-512, 8 on AVX2

    def program(self, family, defines, extra=(), kernel=None):
        """netcl/kernels/<family>.cl built with `defines` as -D options, once per context and options
        (kernel objects are made from it per executable: their set arguments are per executable);
        with `kernel`, that kernel alone, with the options that can change it (runtime.sources)."""
        options = tuple(f"-D{k}={v}" for k, v in defines.items()) + tuple(extra)
        source = runtime.kernel_source(family)
        what = family + ".cl"
        if kernel is not None:
            split = runtime.sources.split(source)
            source, options, what = split.program_source(kernel), split.options_for(kernel, options), f"{what} {kernel}"
        key = (self.q.context, family, kernel, options)  # the Context itself: kept alive, its address never reused
        prog = _programs.get(key)
        if prog is None and runtime.tiers.only_ready() and not runtime.program.cached(self.q.context, source, options):
            raise runtime.tiers.NotReady(what)
        if prog is None:
            STATS["builds"] += 1  # a miss of ours, whether or not runtime.build's caches answer
            prog = _programs[key] = runtime.build(self.q.context, source, options, family=family,
                                                  what=f"{what} ({' '.join(options)})")
        return prog

    def buffer(self, nbytes, zero=False):
        """A device buffer of its own (not pooled), zero-filled when asked."""
        cl = self.cl
        STATS["buffers"] += 1
        buf = cl.Buffer(self.q.context, cl.mem_flags.READ_WRITE, max(int(nbytes), 4))
        if zero:
            cl.enqueue_fill_buffer(self.q, buf, np.float32(0), 0, max(int(nbytes), 4))
        return buf


class Launch:
    """One fused stage on the device for one input shape without the batch, as its kernel family
    sets it up: program and weights here, the batch-dependent rest in sized().

    A family's constructor picks its block sizes, builds its program, makes its weight buffers and sets:
      program, name           the program and its kernel's name
      lsize                   the work-group size
      in_arg, out_arg         the positions of the input and output buffers (the executable binds them)
      res_arg                 the position of the residual buffer (a 4-byte stand-in when unused)
      w_buf, b_buf            device weights and bias, which refresh() fills from pack()
      out_border              the zero border the output plane carries (conv families)
    """
    out_border = 0
    res_arg = None
    _versions = None  # of the stage's source tensors at the last upload

    def sized(self, target, shape):
        """(args, gsize, out_shape, out_bytes) for input `shape`: the kernel's arguments in order with
        None at in_arg and out_arg, the global size, and the output (out_bytes: with its stored border)."""
        raise NotImplementedError

    def passes(self, args, gsize):
        """The kernels this stage launches for sized()'s (args, gsize), in order, as (kernel name, global
        size): each takes the same arguments. One, `name`, unless a family runs more (conv_gpu's split-K)."""
        return [(self.name, gsize)]

    def pack(self, w, b):
        """(host weights, host bias): the folded float32 (w, b) in this family's device layout."""
        raise NotImplementedError

    def refresh(self, target, stage):
        """Fold and upload the weights when any source tensor of `stage` changed since the last upload."""
        vers = [(id(t), t.version) for t in stage.sources]
        if vers == self._versions:
            return
        STATS["folds"] += 1
        host_w, host_b = self.pack(*stage.folded())
        target.cl.enqueue_copy(target.q, self.w_buf, host_w, is_blocking=True)
        target.cl.enqueue_copy(target.q, self.b_buf, host_b, is_blocking=True)
        self._versions = vers
