"""A ColsStage on the device: the column route of netcl.nn.conv_cols (the conv layer's own im2col
and GEMM kernels, through netcl.ops) with the BatchNorm folded into the weights, and the bias and
activation in one epilogue kernel (cols_rows_out_act) instead of the layers' bias, BatchNorm and
activation launches."""
from netcl.jit.common import STATS
from netcl.nn import conv_cols
from netcl.tensor import Tensor


class ColsConv:
    """Callable: conv(x) -> y, a ColsStage on queue q; the folded weights are device tensors of its
    own, re-folded when a source tensor's version moves (load_state_dict, an optimizer step)."""

    def __init__(self, stage, q):
        self.stage, self.q = stage, q
        self.weight = self.bias = None
        self._versions = None
        self._geometry = {}  # input shape -> conv_cols.Cols

    def refresh(self):
        """Fold the weights and upload them when any source tensor of the stage changed since the last fold."""
        vers = [(id(t), t.version) for t in self.stage.sources]
        if vers != self._versions:
            STATS["folds"] += 1
            w, b = self.stage.folded()
            self.weight, self.bias = Tensor.from_host(self.q, w), Tensor.from_host(self.q, b)
            self._versions = vers

    def __call__(self, x):
        """x (N, C, ...) on q -> act(conv(x) with the BatchNorm folded), the conv's output shape."""
        self.refresh()
        g = self._geometry.get(x.shape)
        if g is None:
            if len(self._geometry) >= 8:
                self._geometry.clear()
            g = self._geometry[x.shape] = self.stage.cols(x.shape)
        st = self.stage
        return conv_cols.forward_act(self.q, x, self.weight, self.bias, g, st.layer.output_shape(x.shape), st.act,
                                     st.slope)
