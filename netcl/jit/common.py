"""What every kernel family shares: the STATS counters, the Target a family builds for (program
builds and device buffers go through it, so STATS counts them), Launch (the interface a family
implements) and ConvSpec (one conv stage's sizes and common -D defines, kernels/conv.h).

The batch size is never a define: a family's program and weights serve every batch size, and
only its launch arguments and global size depend on it (Launch.sized)."""
from dataclasses import dataclass
from typing import Optional

import numpy as np

import netcl.runtime as runtime  # module attributes: tests patch runtime.build
from netcl.act import Act

# counters for tests and benchmarks: program builds, device buffers made, kernels launched, weight folds
STATS = {"builds": 0, "buffers": 0, "launches": 0, "folds": 0}
_programs = {}  # (context, family, options) -> pyopencl.Program; bounded by the layers and image sizes seen


class Target:
    """The device one executable builds for: queue, kernel class (gpu or not), compute units, the
    preferred float vector width and the tuning config (netcl.jit.config.JitConfig)."""

    def __init__(self, q, gpu, config):
        import pyopencl as cl

        self.cl, self.q, self.gpu, self.config = cl, q, gpu, config
        self.n_cu = q.device.max_compute_units
        self.vector_width = q.device.preferred_vector_width_float  # PoCL: 16 on AVX-512, 8 on AVX2

    def program(self, family, defines, extra=()):
        """netcl/kernels/<family>.cl built with `defines` as -D options, once per context and options
        (kernel objects are made from it per executable: their set arguments are per executable)."""
        options = tuple(f"-D{k}={v}" for k, v in defines.items()) + tuple(extra)
        key = (self.q.context.int_ptr, family, options)
        prog = _programs.get(key)
        if prog is None:
            STATS["builds"] += 1  # a miss of ours, whether or not runtime.build's caches answer
            prog = _programs[key] = runtime.build(self.q.context, runtime.kernel_source(family), options)
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


def act_defines(act, slope):
    """The ACT and SLOPE defines of kernels/act.h; act: a netcl.act.Act, or None for no activation."""
    return dict(ACT=int(act or 0), SLOPE=repr(np.float32(slope).item()) + "f")


@dataclass(frozen=True)
class ConvSpec:
    """One fused conv stage at one input shape without the batch: what every conv family needs to know."""
    c: int  # input channels, height, width
    h: int
    w: int
    k: int  # output channels
    ks: int  # kernel size, stride, padding
    stride: int
    pad: int
    oh: int  # convolution output size (before the pool)
    ow: int
    pool: bool  # a 2x2/2 max-pool follows
    ipb: int  # stored border of the input plane (0, or at least pad: no bounds checks)
    opb: int  # stored border the output plane must carry (the next conv's padding, else 0)
    act: Optional[Act]  # the activation, or None, and its slope
    slope: float
    kt: int = 0  # channels of the stored output (a Concat's), 0: k; this stage writes from channel koff
    koff: int = 0
    res: bool = False  # the residual add (its tensor stored with border rpb), then act2
    rpb: int = 0
    act2: Optional[Act] = None
    slope2: float = 0.0
    dil: int = 1  # dilation (the depthwise families)
    mult: int = 0  # 0: a dense conv; else depthwise (groups == c) with this channel multiplier

    @property
    def poh(self):  # output size after the pool (floor, as MaxPool2d)
        return self.oh // 2 if self.pool else self.oh

    @property
    def pow(self):
        return self.ow // 2 if self.pool else self.ow

    @property
    def r(self):  # reduction length
        return (1 if self.mult else self.c) * self.ks * self.ks

    @property
    def used(self):
        """(rows, columns) of the conv output that are used: the pool drops an odd last one."""
        return (2 * self.poh, 2 * self.pow) if self.pool else (self.oh, self.ow)

    def out_shape(self, n):
        return n, self.k, self.poh, self.pow

    def stored_shape(self, n):
        """The stored output plane (with its border)."""
        return n, self.kt or self.k, self.poh + 2 * self.opb, self.pow + 2 * self.opb

    def out_bytes(self, n):  # the stored output plane, plus 16 floats of slack for wide vector accesses
        return 4 * (int(np.prod(self.stored_shape(n), dtype=np.int64)) + 16)

    def defines(self):
        """kernels/conv.h's defines; each family adds its own."""
        return dict(C=self.c, H=self.h, W=self.w, K=self.k, KS=self.ks, STRIDE=self.stride, PAD=self.pad,
                    OH=self.oh, OW=self.ow, POOL=2 if self.pool else 1, **act_defines(self.act, self.slope),
                    IPB=self.ipb, OPB=self.opb, KT=self.kt or self.k, KOFF=self.koff, RES=int(self.res),
                    RPB=self.rpb, MULT=self.mult, **{k + "2": v for k, v in act_defines(self.act2, self.slope2).items()})
