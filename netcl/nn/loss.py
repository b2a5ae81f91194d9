"""Losses (mean reduction, PyTorch semantics). Calling a loss returns the mean loss as a 0-d
Tensor on the device, recorded by autograd (`loss.backward()`); `float(loss)` or `loss.item()`
reads it. The explicit API stays: `backward()` returns the gradient of that mean loss w.r.t. the
prediction, and `enqueue()` returns a PendingLoss whose item() reads the value later.

On the device: a loss kernel writes the gradient and per-work-group sums, `loss_sum` their total
and the mean; nothing is read until the value is asked for. A value the kernel refuses (a class
index outside [0, C) given on the device, a BCELoss prediction outside [0, 1]) raises ValueError
when the loss is read and at its backward (a read there: only for losses that can refuse);
class indices given on the host are checked at once. Targets already on the device are used there."""
import functools
import weakref

import numpy as np

from netcl import array_ops, autograd, ops
from netcl.autograd import Node, attach
from netcl.nn.linear import Linear
from netcl.tensor import INT32, Tensor

_RED = 64  # loss.cl's work-group size (RED)


class _Loss:
    kernel = ""
    can_refuse = False  # whether the kernel may refuse an input (then reading the loss checks)

    def __init__(self):
        self._grad = self._pending = None

    def _reduce(self, q, items, count, refuse, *args, can_refuse=False):
        """Launch self.kernel over `items` work-items with `args` (then its partial sums), then the
        total: a PendingLoss of the mean over `count` terms, refuse() raising where it refused."""
        groups = -(-items // _RED)
        part, out, mean = ops.new(q, (2 * groups,)), ops.new(q, (2,)), ops.new(q, ())
        ops.launch(q, "loss", self.kernel, (groups * _RED,), (_RED,), *args, part)
        ops.launch(q, "loss", "loss_sum", (_RED,), (_RED,), groups, part, out, mean, 1.0 / count)
        return PendingLoss(out.mark_written(), count, refuse, mean.mark_written(), can_refuse)

    def __call__(self, pred, target):
        """The mean loss as a 0-d Tensor, recorded by autograd where pred requires grad; after the
        call backward() gives its gradient w.r.t. pred (the explicit API)."""
        if isinstance(target, Tensor) and target.requires_grad and autograd.recording():
            return self.composite(pred, target)  # the kernels differentiate w.r.t. the prediction only
        pending = self.enqueue(pred, target)
        self._pending = pending  # backward() checks a refusal (enqueue()'s callers read it at item())
        loss = pending.take()
        loss._on_read = pending.check
        if autograd.needs_record(pred):
            attach(LossBackward(type(self).__name__, pred, self._grad, pending), loss)
        return loss

    def composite(self, pred, target):
        """The loss as tensor operations, differentiable w.r.t. both arguments."""
        raise NotImplementedError(f"{type(self).__name__} with a target that requires grad")

    def backward(self):
        if self._grad is None:
            raise RuntimeError(f"{type(self).__name__}.backward() called before the loss was computed")
        if self._pending is not None:
            self._pending.check()  # a refused input: no gradient
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
        """The target on pred's device: a Tensor there as it is, anything else uploaded."""
        self._check_prediction(pred)
        if not isinstance(target, Tensor):
            try:
                target = np.asarray(target, np.float32)
            except (TypeError, ValueError):
                raise TypeError(f"{type(self).__name__} targets must be numbers, got {type(target).__name__}") from None
        if tuple(target.shape) != pred.shape:
            raise ValueError(f"{type(self).__name__}: target shape {tuple(target.shape)} differs from prediction "
                             f"{pred.shape}")
        return _on_device(pred.queue, target)

    def enqueue(self, pred, target):
        """The loss and its gradient enqueued, not waited for: a PendingLoss (item() reads the mean
        loss); backward() gives the gradient at once. An input the kernel refuses (BCELoss: a
        prediction outside [0, 1]) gets a zero gradient and makes item() raise."""
        t = self._target(pred, target)
        self._grad = ops.new(pred, pred.shape)
        size = pred.size
        refuse = functools.partial(type(self)._refuse, size)  # (the class's: no cycle through self._pending)
        pending = self._reduce(pred.queue, size, size, refuse, size, pred, t, self._grad, can_refuse=self.can_refuse)
        self._grad.mark_written()
        self._pending = None
        return pending

    @staticmethod
    def _refuse(size):
        raise AssertionError("this loss refuses nothing")


class LossBackward(Node):
    """A loss kernel's gradient w.r.t. the prediction (of the mean loss), times the incoming one."""

    takes_one = True

    def __init__(self, name, pred, grad, pending):
        super().__init__((pred,))
        self.loss, self.grad, self.pending = name, grad, pending

    @property
    def name(self):
        """The node\'s name in messages and reprs."""
        return f"{self.loss}Backward"

    def backward(self, dy):
        self.pending.check()
        return (self.grad if dy is autograd.ONE else array_ops.binary("mul", self.grad, dy),)

    def release(self):
        super().release()
        self.grad = None


class PendingLoss:
    """A loss enqueued on the device (a loss's enqueue()): item() reads its mean once (later calls
    return the same float) and raises ValueError where the loss refused its input; float(p) is
    p.item(). `tensor` is the mean as a 0-d device Tensor."""

    __slots__ = ("_out", "_count", "_refuse", "_value", "_tensor", "_weak", "can_refuse")

    def __init__(self, out, count, refuse, tensor=None, can_refuse=True):
        self._out, self._count, self._refuse, self._value = out, count, refuse, None
        self._tensor, self._weak, self.can_refuse = tensor, None, can_refuse

    @property
    def tensor(self):
        """The mean loss as a 0-d device Tensor (None once that tensor is gone, after take())."""
        return self._weak() if self._weak is not None else self._tensor

    def take(self):
        """The tensor, which will refer to this loss (its read checks it) and is from now on held
        weakly here: no reference cycle keeps its buffers from the pool."""
        t, self._tensor = self._tensor, None
        self._weak = weakref.ref(t)
        return t

    def check(self):
        """ValueError where the loss refused its input (a read from the device where it could); the
        tensor's value then comes from that read (the same float32 the kernel wrote)."""
        if self.can_refuse:
            value = self.item()
            t = self.tensor
            if t is not None and t.storage.host is None:
                t.storage.host = np.array([value], np.float32)

    def item(self):
        """The mean loss as a Python float (read once); ValueError where the loss refused its input."""
        if self._value is None:
            total, refused = self._out.numpy()
            if refused:
                self._refuse()
            # as the kernel's mean (loss_sum): float32 total times float32 1/count, so the two agree
            self._value = float(np.float32(total) * np.float32(1.0 / self._count))
        return self._value

    __float__ = item

    def __repr__(self):
        return f"PendingLoss({self._value})" if self._value is not None else "PendingLoss(not read)"


def _labels(q, labels):
    """Class indices on q's device as the loss kernels read them (float32: exact for any class count)."""
    if isinstance(labels, Tensor) and labels.dtype == INT32 and labels.on_device:
        return array_ops.to_float(labels)
    return _on_device(q, labels)


def _on_device(q, x):
    """`x` (an array or a Tensor) on q's device: a Tensor already there is used, not copied."""
    if isinstance(x, Tensor) and x.on_device and x.queue.context == q.context:
        return x
    return Tensor.from_host(q, x)


class MSELoss(_Loss):
    """Mean squared error, as torch.nn.MSELoss()."""
    kernel = "mse"
    can_refuse = False

    def composite(self, pred, target):
        return ((pred - target) ** 2).mean()


class BCELoss(_Loss):
    """Binary cross-entropy on probabilities (e.g. after Sigmoid); logs clamped at -100 as PyTorch.
    Predictions outside [0, 1] (or NaN) raise ValueError, as PyTorch does."""
    kernel = "bce"
    can_refuse = True

    def composite(self, pred, target):
        lp, lq = pred.log().clamp(min=-100.0), (1.0 - pred).log().clamp(min=-100.0)
        return -(target * lp + (1.0 - target) * lq).mean()

    @staticmethod
    def _refuse(size):
        raise ValueError(f"BCELoss expects probabilities: every prediction must be between 0 and 1 (e.g. the "
                         f"output of Sigmoid), but some of the {size} values are outside [0, 1] or NaN")


class CrossEntropyLoss(_Loss):
    """log-softmax + negative log-likelihood over logits (N, C) and class indices (N,). Indices on
    the host are checked there; a Tensor of them on the device is checked by the kernel."""
    kernel = "cross_entropy"

    def enqueue(self, logits, labels):
        """As _Loss.enqueue: labels on the host are checked here (ValueError at once); labels on
        the device by the kernel, a refused one getting its row a zero gradient and making item()
        raise."""
        self._check_prediction(logits, rank=2)
        n, c = logits.shape
        if not (isinstance(labels, Tensor) and labels.on_device):
            labels = self._host_labels(labels, n, c)
        elif labels.shape != (n,):
            raise ValueError(f"CrossEntropyLoss expects {n} class indices, got labels of shape {labels.shape}")
        on_device = isinstance(labels, Tensor) and labels.on_device
        q = logits.queue
        self._grad = ops.new(q, (n, c))

        def refuse():
            raise ValueError(f"CrossEntropyLoss labels must be integers in [0, {c}) (class indices); some of the "
                             f"{n} labels on the device are not")
        pending = self._reduce(q, n, n, refuse, n, c, logits, _labels(q, labels), self._grad, can_refuse=on_device)
        self._grad.mark_written()
        self._pending = None
        return pending

    def enqueue_linear(self, linear, x, labels, input_grad=True):
        """The loss of linear(x) and every gradient of the pair, on a CPU device in one kernel
        (head_cpu.cl; netcl.TrainStep runs a classifier's last Linear this way): returns (the
        logits, a PendingLoss, dL/dx or None without input_grad). linear's parameter gradients are
        written (or added to) as its backward would, and backward() gives dL/dlogits as after
        enqueue(). x: (N, in_features); linear: at most 16 outputs."""
        if type(linear) is not Linear or linear.out_features > 16:
            raise ValueError(f"enqueue_linear takes a Linear with at most 16 outputs, got {linear!r}")
        self._check_prediction(x, rank=2)
        q = x.queue
        if not ops.is_cpu(q):
            raise ValueError("enqueue_linear runs on CPU devices (its kernel is one work-item)")
        n, c = x.shape[0], linear.out_features
        logits = ops.new(q, linear.output_shape(x.shape))
        if not (isinstance(labels, Tensor) and labels.on_device):
            labels = self._host_labels(labels, n, c)
        elif labels.shape != (n,):
            raise ValueError(f"CrossEntropyLoss expects {n} class indices, got labels of shape {labels.shape}")
        linear._on(x)
        unused, has_bias = ops.dummy(q), linear.bias is not None  # (for the pointers the kernel skips)
        gw, acc_w = ops.grad_target(linear.weight)
        gb, acc_b = ops.grad_target(linear.bias) if has_bias else (unused, False)
        self._grad = ops.new(q, (n, c))
        dx = ops.new(q, x.shape) if input_grad else unused
        padded, wt = ops.new(q, (n, 16)), ops.new(q, (c, linear.in_features)) if input_grad else unused
        out = ops.new(q, (2,))
        ops.launch(q, "head_cpu", "linear_ce_cpu", (1,), (1,), n, linear.in_features, c, x, linear.weight,
                   linear.bias if has_bias else unused, int(has_bias), _labels(q, labels), logits, self._grad,
                   padded, wt, gw, int(acc_w), gb, int(acc_b), dx, int(input_grad), out)
        for t in (logits, self._grad, gw, out) + ((gb,) if has_bias else ()):
            t.mark_written()
        linear._x2 = x  # as its forward saves it

        def refuse():
            raise ValueError(f"CrossEntropyLoss labels must be integers in [0, {c}) (class indices); some of the "
                             f"{n} labels on the device are not")
        return logits, PendingLoss(out, n, refuse), dx.mark_written() if input_grad else None

    @staticmethod
    def _host_labels(labels, n, c):
        """Class indices from the host, checked, as float32 (exact for any class count a model has)."""
        y = labels.to_host() if isinstance(labels, Tensor) else np.asarray(labels)
        if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
            raise TypeError(f"CrossEntropyLoss labels must be class indices (integers), got dtype {y.dtype}")
        if y.shape != (n,):
            raise ValueError(f"CrossEntropyLoss expects {n} class indices, got labels of shape {y.shape}")
        if y.size and (y.min() < 0 or y.max() >= c or not np.all(np.equal(np.mod(y, 1), 0))):
            raise ValueError(f"CrossEntropyLoss labels must be integers in [0, {c}), got {y.min()}..{y.max()}")
        return y.astype(np.float32)
