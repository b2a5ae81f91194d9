"""Upsample: integer-factor nearest or bilinear (align_corners=False) resizing, as
torch.nn.Upsample (kernels/resize.cl)."""
from netcl import ops
from netcl.nn.module import Module, check_rank, positive

MODES = ("nearest", "bilinear")


class Upsample(Module):
    """Upsample(scale_factor=2, mode="nearest"): (N, C, H, W) -> (N, C, H*s, W*s), nearest or bilinear (align_corners=False)."""
    CALL_STATE = ("_in_shape",)

    # x: (N, C, H, W) -> (N, C, H*s, W*s)
    def __init__(self, scale_factor=2, mode="nearest"):
        super().__init__()
        if isinstance(scale_factor, float) and scale_factor.is_integer():
            scale_factor = int(scale_factor)  # torch models often say 2.0
        elif isinstance(scale_factor, float):
            raise ValueError(f"Upsample supports integer scale factors, got {scale_factor}")
        self.scale_factor = positive("scale_factor", scale_factor)
        if mode not in MODES:
            raise ValueError(f"Upsample mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
        self.mode = mode

    def config(self):
        return {"scale_factor": self.scale_factor, "mode": self.mode}

    def output_shape(self, shape):
        check_rank("Upsample", shape, 4, "(N, C, H, W)")
        n, c, h, w = shape
        return (n, c, h * self.scale_factor, w * self.scale_factor)

    def forward(self, x):
        q = self._on(x)
        y = ops.new(q, self.output_shape(x.shape))
        _, _, h, w = x.shape
        ops.launch1d(q, "resize", f"{self.mode}_fwd", y.size, y.size, self.scale_factor, h, w, x, y)
        self._in_shape = x.shape
        return y.mark_written()

    def backward(self, dy):
        _, _, h, w = self._in_shape
        dx = ops.new(dy, self._in_shape)
        ops.launch1d(dy.queue, "resize", f"{self.mode}_bwd", dx.size, dx.size, self.scale_factor, h, w, dy, dx)
        return dx.mark_written()
