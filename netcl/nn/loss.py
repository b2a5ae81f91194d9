"""Losses (mean reduction, PyTorch semantics). Calling a loss returns the loss as a Python
float; `backward()` then returns the gradient of that mean loss w.r.t. the prediction."""
import numpy as np

from netcl import ops
from netcl.tensor import Tensor


class _Loss:
    kernel = ""

    def __init__(self):
        self._grad = None

    def _finish(self, terms, out=None):
        """The mean of `terms`; `out` (2,) may carry a flag a loss kernel set in out[1], read in the same transfer."""
        out = out if out is not None else ops.new(terms, (2,))
        ops.launch(terms.queue, "loss", "sum_all", (64,), (64,), terms.size, terms, out)
        total, flag = out.mark_written().numpy()
        return float(total) / terms.size, bool(flag)

    def backward(self):
        if self._grad is None:
            raise RuntimeError(f"{type(self).__name__}.backward() called before the loss was computed")
        return self._grad

    def _check_prediction(self, pred, rank=None):
        name = type(self).__name__
        if not isinstance(pred, Tensor):
            raise TypeError(f"{name} expects a netcl Tensor prediction, got {type(pred).__name__}")
        if rank is not None and pred.ndim != rank:
            raise ValueError(f"{name} expects a (N, C) prediction, got shape {pred.shape}")
        if pred.size == 0:
            raise ValueError(f"{name} needs a non-empty batch, got shape {pred.shape}")
        if pred.queue is None:
            raise ValueError(f"{name}: the prediction is on the host; losses run on the device (a model output, "
                             "or Tensor.from_host(queue, x))")

    def _target(self, pred, target):
        self._check_prediction(pred)
        try:
            t = target.to_host() if isinstance(target, Tensor) else np.asarray(target, np.float32)
        except (TypeError, ValueError):
            raise TypeError(f"{type(self).__name__} targets must be numbers, got {type(target).__name__}") from None
        if t.shape != pred.shape:
            raise ValueError(f"{type(self).__name__}: target shape {t.shape} differs from prediction {pred.shape}")
        return Tensor.from_host(pred.queue, t)

    def __call__(self, pred, target):
        t = self._target(pred, target)
        terms, self._grad = ops.new(pred, pred.shape), ops.new(pred, pred.shape)
        out = Tensor.zeros(pred.queue, (2,))
        ops.launch1d(pred.queue, "loss", self.kernel, pred.size, pred.size, pred, t, terms, self._grad, out)
        self._grad.mark_written()
        loss, flagged = self._finish(terms.mark_written(), out)
        if flagged:
            self._grad = None
            self._refuse(pred)
        return loss

    def _refuse(self, pred):
        raise AssertionError(f"{self.kernel} flags nothing")


class MSELoss(_Loss):
    kernel = "mse"


class BCELoss(_Loss):
    """Binary cross-entropy on probabilities (e.g. after Sigmoid); logs clamped at -100 as PyTorch.
    Predictions outside [0, 1] (or NaN) raise ValueError, as PyTorch does."""
    kernel = "bce"

    def _refuse(self, pred):
        raise ValueError(f"BCELoss expects probabilities: every prediction must be between 0 and 1 (e.g. the "
                         f"output of Sigmoid), but some of the {pred.size} values are outside [0, 1] or NaN")


class CrossEntropyLoss(_Loss):
    """log-softmax + negative log-likelihood over logits (N, C) and class indices (N,)."""

    def __call__(self, logits, labels):
        self._check_prediction(logits, rank=2)
        n, c = logits.shape
        y = labels.to_host() if isinstance(labels, Tensor) else np.asarray(labels)
        if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
            raise TypeError(f"CrossEntropyLoss labels must be class indices (integers), got dtype {y.dtype}")
        if y.shape != (n,):
            raise ValueError(f"CrossEntropyLoss expects {n} class indices, got labels of shape {y.shape}")
        if y.size and (y.min() < 0 or y.max() >= c or not np.all(np.equal(np.mod(y, 1), 0))):
            raise ValueError(f"CrossEntropyLoss labels must be integers in [0, {c}), got {y.min()}..{y.max()}")
        import pyopencl as cl

        q = logits.queue
        lab = cl.Buffer(q.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                        hostbuf=np.ascontiguousarray(y, np.int32))
        terms, self._grad = ops.new(q, (n,)), ops.new(q, (n, c))
        ops.launch1d(q, "loss", "cross_entropy", n, n, c, logits, lab, terms, self._grad)
        self._grad.mark_written()
        return self._finish(terms.mark_written())[0]
