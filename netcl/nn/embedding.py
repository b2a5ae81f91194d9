"""Embedding: a lookup table of vectors, rows gathered by integer indices (kernels/embedding.cl)."""
import numpy as np

from netcl import array_ops, ops
from netcl.nn.module import Module, Parameter, as_int, positive, rng
from netcl.tensor import FLOAT32, INT32, Tensor


class Embedding(Module):
    # idx: (*) integers in [0, num_embeddings) -> (*, embedding_dim)
    """Embedding(num_embeddings, embedding_dim, padding_idx=None): integer indices (*) -> their rows of
    `weight` (num_embeddings, embedding_dim), (*, embedding_dim), as torch.nn.Embedding. Indices come as
    an int tensor (netcl.tensor of an integer array), a numpy integer array, or a float tensor of whole
    numbers (what predict() and an imported ONNX graph hand over). An index out of range raises
    IndexError wherever the host holds the indices (numpy input, netcl.tensor before and after its
    upload); indices that only a device kernel wrote are not checked there: out of range they give
    rows of zeros. The padding_idx row starts at zero and gets no gradient. The weight gradient is a
    scatter-add without atomics, deterministic with repeated indices."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None):
        super().__init__()
        self.num_embeddings = positive("num_embeddings", num_embeddings)
        self.embedding_dim = positive("embedding_dim", embedding_dim)
        if padding_idx is not None:  # (as torch: a negative one counts from the end, and is kept as its row)
            padding_idx = as_int("padding_idx", padding_idx, -self.num_embeddings, self.num_embeddings - 1)
            padding_idx %= self.num_embeddings
        self.padding_idx = padding_idx
        w = rng().standard_normal(self.tensor_shapes(self.num_embeddings, self.embedding_dim)["weight"],
                                  dtype=np.float32)  # N(0, 1), torch's initialisation
        if padding_idx is not None:
            w[padding_idx] = 0.0
        self.weight = Parameter(Tensor.from_host(None, w))

    @classmethod
    def tensor_shapes(cls, num_embeddings, embedding_dim, padding_idx=None):
        return {"weight": (num_embeddings, embedding_dim)}

    def config(self):
        return {"num_embeddings": self.num_embeddings, "embedding_dim": self.embedding_dim,
                "padding_idx": self.padding_idx}

    def output_shape(self, shape):
        return tuple(shape) + (self.embedding_dim,)

    def __call__(self, x, *args, **kwargs):
        if not isinstance(x, Tensor):  # a numpy integer array (or list): checked and made an int tensor
            a = np.asarray(x)
            if a.dtype.kind not in "iu":
                raise TypeError(f"Embedding takes integer indices, got an array of {a.dtype}")
            self._check(a)
            x = Tensor(a.shape, None, None, a.astype(np.int32), dtype=INT32)
        return super().__call__(x, *args, **kwargs)

    def _check(self, a):
        """IndexError unless every index in host array `a` lies in [0, num_embeddings)."""
        if a.size and (a.min() < 0 or a.max() >= self.num_embeddings):
            bad = a[(a < 0) | (a >= self.num_embeddings)].ravel()[0]
            raise IndexError(f"Embedding({self.num_embeddings}, {self.embedding_dim}): index {int(bad)} is out of "
                             f"range [0, {self.num_embeddings})")

    def _indices(self, x):
        """x as a device int32 tensor, checked where the host holds it."""
        host = x.storage.host
        if x.dtype == INT32:
            if host is not None:
                self._check(host)
            return x
        if x.dtype != FLOAT32:
            raise TypeError(f"Embedding takes integer indices, got a tensor of {x.dtype}")
        if host is None:
            return array_ops.to_int(x)  # (toward zero, on the device)
        if not np.all(np.isfinite(host)) or np.any(host != np.trunc(host)):
            raise TypeError("Embedding takes integer indices, got a float tensor of values that are not whole numbers")
        self._check(host)
        return Tensor(x.shape, None, None, host.astype(np.int32), dtype=INT32).to(x.queue)

    def forward(self, x):
        q = self._on(x)
        idx = self._indices(x)
        d = self.embedding_dim
        y = ops.new(q, self.output_shape(x.shape))
        if y.size:
            ops.launch1d(q, "embedding", "embedding_fwd", y.size, y.size, self.num_embeddings, d, idx, self.weight, y)
        self._saved = idx
        return y.mark_written()

    def backward(self, dy):
        """The weight's gradient (the indices have none): returns None."""
        idx = self._saved
        gw, acc = ops.grad_target(self.weight)
        if not acc:
            gw.fill_(0.0)
        pad = -1 if self.padding_idx is None else self.padding_idx
        if idx.size:
            ops.launch1d(dy.queue, "embedding", "embedding_bwd", self.embedding_dim, idx.size, self.num_embeddings,
                         self.embedding_dim, pad, idx, dy, gw)
        gw.mark_written()
        return None
