"""What every kernel family shares: the STATS counters, the Target a family builds for (program
builds and device buffers go through it, so STATS counts them), Launch (the interface a family
implements) and ConvSpec (one conv stage's sizes and common -D defines, kernels/conv.h)."""
from dataclasses import dataclass
from typing import Optional

import numpy as np

import netcl.runtime as runtime  # module attributes: tests patch runtime.build
from netcl.act import Act

# counters for tests and benchmarks: program builds, device buffers made, kernels launched, weight folds
STATS = {"builds": 0, "buffers": 0, "launches": 0, "folds": 0}


class Target:
    """The device one executable builds for: queue, kernel class (gpu or not), compute units and
    the tuning config (netcl.jit.config.JitConfig)."""

    def __init__(self, q, gpu, config):
        import pyopencl as cl

        self.cl, self.q, self.gpu, self.config = cl, q, gpu, config
        self.n_cu = q.device.max_compute_units

    def kernel(self, family, name, defines, extra=()):
        """Kernel `name` of netcl/kernels/<family>.cl built with `defines` as -D options."""
        STATS["builds"] += 1  # counted whether or not the caches answer: a call here is a miss of ours
        options = [f"-D{k}={v}" for k, v in defines.items()] + list(extra)
        prog = runtime.build(self.q.context, runtime.kernel_source(family), options)
        return self.cl.Kernel(prog, name)

    def buffer(self, nbytes, zero=False):
        """A device buffer of its own (not pooled), zero-filled when asked."""
        cl = self.cl
        STATS["buffers"] += 1
        buf = cl.Buffer(self.q.context, cl.mem_flags.READ_WRITE, max(int(nbytes), 4))
        if zero:
            cl.enqueue_fill_buffer(self.q, buf, np.float32(0), 0, max(int(nbytes), 4))
        return buf


class Launch:
    """One fused stage on the device for one input shape, as its kernel family sets it up.

    A family's constructor picks its block sizes, builds its program, makes its buffers and sets:
      kernel, gsize, lsize     what to enqueue
      args                     the kernel's arguments in order, None at in_arg and out_arg (the
                               input and output buffers, which the executable binds)
      w_buf, b_buf             device weights and bias, which the executable fills from pack()
      out_shape, out_bytes     the output (out_bytes includes the stored border)
      out_border               the zero border the output plane carries (conv families)
    The executable adds out_buf and bound_in (the buffers now bound) when it binds the arguments.
    """
    out_border = 0

    def pack(self, w, b):
        """(host weights, host bias): the folded float32 (w, b) in this family's device layout."""
        raise NotImplementedError


def act_defines(act, slope):
    """The ACT and SLOPE defines of kernels/act.h; act: a netcl.act.Act, or None for no activation."""
    return dict(ACT=int(act or 0), SLOPE=repr(np.float32(slope).item()) + "f")


@dataclass(frozen=True)
class ConvSpec:
    """One fused conv stage at one input shape: what every conv family needs to know."""
    n: int  # batch
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
    ipb: int  # stored border of the input plane (0 or pad)
    opb: int  # stored border the output plane must carry (the next conv's padding, else 0)
    act: Optional[Act]  # the activation, or None, and its slope
    slope: float

    @property
    def poh(self):  # output size after the pool (floor, as MaxPool2d)
        return self.oh // 2 if self.pool else self.oh

    @property
    def pow(self):
        return self.ow // 2 if self.pool else self.ow

    @property
    def r(self):  # reduction length
        return self.c * self.ks * self.ks

    @property
    def used(self):
        """(rows, columns) of the conv output that are used: the pool drops an odd last one."""
        return (2 * self.poh, 2 * self.pow) if self.pool else (self.oh, self.ow)

    @property
    def out_shape(self):
        return self.n, self.k, self.poh, self.pow

    @property
    def out_bytes(self):  # the stored output plane, plus 16 floats of slack for wide vector accesses
        return 4 * (self.n * self.k * (self.poh + 2 * self.opb) * (self.pow + 2 * self.opb) + 16)

    def defines(self):
        """kernels/conv.h's defines; each family adds its own."""
        return dict(C=self.c, H=self.h, W=self.w, K=self.k, KS=self.ks, STRIDE=self.stride, PAD=self.pad,
                    OH=self.oh, OW=self.ow, POOL=2 if self.pool else 1, **act_defines(self.act, self.slope),
                    IPB=self.ipb, OPB=self.opb)
