"""Losses with torch.nn's names, arguments and semantics (reduction "mean", "sum" or "none").
Calling a loss returns the loss as a Tensor on the device (0-d unless reduction="none"), recorded
by autograd (`loss.backward()`); `float(loss)` or `loss.item()` reads it. The explicit API stays:
`backward()` returns the gradient of the (scalar) loss w.r.t. the prediction, and `enqueue()`
returns a PendingLoss whose item() reads the value later.

Two ways to compute a loss, the same semantics:
- fused (MSELoss, BCELoss and CrossEntropyLoss in their plain form: mean reduction, no weights,
  no label smoothing, CrossEntropyLoss on (N, C) with class indices): a loss kernel writes the
  gradient and per-work-group sums, `loss_sum` their total and the mean; two launches, nothing read
  until the value is asked for;
- composed of tensor operations (netcl.functions, every other form and loss): the call records
  them with autograd; enqueue() and backward() evaluate them on a detached copy of the prediction
  and differentiate it.

A value the kernels refuse (a class index outside [0, C) and not ignore_index, given on the device;
a BCELoss prediction outside [0, 1] in the fused form) raises ValueError when the loss is read and
at its backward; class indices given on the host are checked at once. In the fused form a class
index on the device equal to ignore_index is refused too (the kernel scales the gradient by the
count of labels, which only the host knows): give such labels on the host. Targets already on the
device are used there."""
import functools
import weakref

import numpy as np

from netcl import array_ops, autograd, functions, ops
from netcl.autograd import Node, attach
from netcl.nn.linear import Linear
from netcl.nn.module import as_float
from netcl.tensor import INT32, Tensor

_RED = 64  # loss.cl's work-group size (RED)
REDUCTIONS = ("mean", "sum", "none")


def _reduction(reduction, size_average=None, reduce=None):
    """The reduction, from torch's deprecated size_average/reduce where one is given (torch's rule)."""
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        reduction = "mean" if size_average and reduce else "sum" if reduce else "none"
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return reduction


def reduce(loss, reduction):
    """loss (a tensor of terms) reduced: its mean, its sum, or itself ("none")."""
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _optional_tensor(name, t, shape=None):
    """A weight argument (None, an array or a Tensor) as a float32 Tensor, or None."""
    if t is None:
        return None
    t = t if isinstance(t, Tensor) else Tensor.from_host(None, np.asarray(t, np.float32))
    if shape is not None and t.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {t.shape}")
    return t


def _on_queue(t, q):
    """A weight tensor on q's device: a host tensor moves there once (so a recorded step uploads nothing)."""
    if t.queue is None or not t.on_device:
        t.to(q)
    return t


class _Loss:
    kernel = ""  # the fused form's kernel in loss.cl ("": composed only)
    can_refuse = False  # whether the kernel may refuse an input (then reading the loss checks)

    def __init__(self, reduction="mean", size_average=None, reduce=None):
        self.reduction = _reduction(reduction, size_average, reduce)
        self._grad = self._pending = self._last = None

    def fused(self, pred, target):
        """Whether this call runs as the loss kernel (else as tensor operations)."""
        return bool(self.kernel) and self.reduction == "mean"

    def _reduce(self, q, items, count, refuse, *args, can_refuse=False):
        """Launch self.kernel over `items` work-items with `args` (then its partial sums), then the
        total: a PendingLoss of the mean over `count` terms, refuse() raising where it refused."""
        groups = -(-items // _RED)
        part, out, mean = ops.new(q, (2 * groups,)), ops.new(q, (2,)), ops.new(q, ())
        ops.launch(q, "loss", self.kernel, (groups * _RED,), (_RED,), *args, part)
        ops.launch(q, "loss", "loss_sum", (_RED,), (_RED,), groups, part, out, mean, 1.0 / count)
        return PendingLoss(out.mark_written(), count, refuse, mean.mark_written(), can_refuse)

    def __call__(self, pred, target):
        """The loss as a Tensor (0-d unless reduction="none"), recorded by autograd where pred (or
        the target) requires grad; after the call backward() gives its gradient w.r.t. pred (the
        explicit API)."""
        self._check_prediction(pred)
        composed = not self.fused(pred, target) or (
            isinstance(target, Tensor) and target.requires_grad and autograd.recording())
        if composed:
            self._grad = self._pending = None
            # backward() differentiates it on demand: its data only (a view without its node), so that
            # the graph behind it is not kept into the next step
            self._last = (pred.detach(), target)
            return self._composed(pred, target)
        self._last = None
        pending = self.enqueue(pred, target)
        self._pending = pending  # backward() checks a refusal (enqueue()'s callers read it at item())
        loss = pending.take()
        if pending.can_refuse:
            loss._on_read = pending.check
        if autograd.needs_record(pred):
            attach(LossBackward(type(self).__name__, pred, self._grad, pending), loss)
        return loss

    def composite(self, pred, target):
        """The loss as tensor operations, differentiable w.r.t. both arguments: (the loss, None or a
        1-element device Tensor that is nonzero where an input was refused)."""
        raise NotImplementedError(f"{type(self).__name__} with a target that requires grad")

    def _composed(self, pred, target):
        loss, bad = self.composite(pred, target)
        if bad is not None:
            loss._on_read = functools.partial(_check_flag, bad, self._refusal(pred))
        return loss

    def _refusal(self, pred):
        """The function that raises this loss's ValueError for a refused input."""
        return functools.partial(type(self)._refuse, pred.size)

    def backward(self):
        """The gradient of the last call's (scalar) loss w.r.t. its prediction."""
        if self._grad is None and self._last is not None:
            pred, target = self._last
            self._grad, pending = self._differentiate(pred, target)
            self._pending, self._last = pending, None
        if self._grad is None:
            raise RuntimeError(f"{type(self).__name__}.backward() called before the loss was computed")
        if self._pending is not None:
            self._pending.check()  # a refused input: no gradient
        return self._grad

    def _differentiate(self, pred, target):
        """The composed loss on a detached copy of pred, differentiated: (dloss/dpred, a PendingLoss)."""
        if self.reduction == "none":
            raise ValueError(f"{type(self).__name__}(reduction='none') gives a loss per element: enqueue() and "
                             "backward() take a scalar loss (reduction 'mean' or 'sum'); call loss.backward(gradient)")
        x = pred.detach()
        x.requires_grad = True
        with autograd.enable_grad():
            loss, bad = self.composite(x, target)
            loss.backward()
        q = pred.queue
        out = ops.new(q, (2,)).fill_(0.0)  # (loss, refused), as a loss kernel's loss_sum writes it
        array_ops.copy_strided(loss, (1,), (1,), 0, out, (1,), 0)
        if bad is not None:
            array_ops.copy_strided(bad, (1,), (1,), 0, out, (1,), 1)
        return x.grad, PendingLoss(out, 1, self._refusal(pred), loss.detach(), bad is not None)

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
        target = _on_device(pred.queue, target)
        return array_ops.to_float(target) if target.dtype == INT32 else target

    def check_target(self, target, out_shape):
        """The target as the host array netcl.TrainStep uploads (float32), checked as a call checks it."""
        a = np.asarray(target.to_host() if isinstance(target, Tensor) else target, np.float32)
        if a.shape != tuple(out_shape):
            raise ValueError(f"{type(self).__name__}: target shape {a.shape} differs from prediction "
                             f"{tuple(out_shape)}")
        return a

    def enqueue(self, pred, target):
        """The loss and its gradient enqueued, not waited for: a PendingLoss (item() reads the
        loss); backward() gives the gradient at once. An input the kernel refuses (BCELoss: a
        prediction outside [0, 1]) gets a zero gradient and makes item() raise."""
        self._check_prediction(pred)
        self._last = None
        if not self.fused(pred, target):
            self._grad, pending = self._differentiate(pred, target)
            self._pending = None
            return pending
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


def _check_flag(bad, refuse):
    """A composed loss's read: refuse() where the refusal flag is set (read once)."""
    if bad.numpy().reshape(-1)[0]:
        refuse()


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
        self.grad = self.pending = None


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
    """MSELoss(size_average=None, reduce=None, reduction="mean"): squared error, as torch.nn.MSELoss."""
    kernel = "mse"

    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__(reduction, size_average, reduce)

    def composite(self, pred, target):
        """(pred - target)^2, reduced."""
        return reduce((pred - self._operand(pred, target)) ** 2, self.reduction), None

    def _operand(self, pred, target):
        return target if isinstance(target, Tensor) and target.requires_grad else self._target(pred, target)


class BCELoss(_Loss):
    """BCELoss(weight=None, size_average=None, reduce=None, reduction="mean"): binary cross-entropy
    on probabilities (e.g. after Sigmoid); logs clamped at -100 as PyTorch. weight: a rescaling of
    each element (broadcast to the prediction). Predictions outside [0, 1] (or NaN) raise ValueError
    in the fused form (mean, no weight), as PyTorch does."""
    kernel = "bce"
    can_refuse = True

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
        super().__init__(reduction, size_average, reduce)
        self.weight = _optional_tensor("weight", weight)

    def fused(self, pred, target):
        """The kernel's form: mean, no weight."""
        return self.weight is None and self.reduction == "mean"

    def composite(self, pred, target):
        """-(t log p + (1 - t) log(1 - p)) (logs clamped at -100), weighted and reduced."""
        t = target if isinstance(target, Tensor) and target.requires_grad else self._target(pred, target)
        loss = -(t * pred.log().clamp(min=-100.0) + (1.0 - t) * (1.0 - pred).log().clamp(min=-100.0))
        if self.weight is not None:
            loss = loss * _on_queue(self.weight, pred.queue)
        return reduce(loss, self.reduction), None

    @staticmethod
    def _refuse(size):
        raise ValueError(f"BCELoss expects probabilities: every prediction must be between 0 and 1 (e.g. the "
                         f"output of Sigmoid), but some of the {size} values are outside [0, 1] or NaN")


class BCEWithLogitsLoss(_Loss):
    """BCEWithLogitsLoss(weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None):
    sigmoid and binary cross-entropy in one stable form, as torch.nn.BCEWithLogitsLoss; pos_weight
    weighs the positive term (broadcast along the last dimension: one per class)."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None):
        super().__init__(reduction, size_average, reduce)
        self.weight = _optional_tensor("weight", weight)
        self.pos_weight = _optional_tensor("pos_weight", pos_weight)

    def composite(self, pred, target):
        """max(x, 0) - x t + log(1 + exp(-|x|)); with pos_weight p: (1 - t) x + (1 + (p - 1) t)
        (log(1 + exp(-|x|)) + max(-x, 0))."""
        x = pred
        t = target if isinstance(target, Tensor) and target.requires_grad else self._target(pred, target)
        soft = (1.0 + (-x.abs()).exp()).log()
        if self.pos_weight is None:
            loss = x.relu() - x * t + soft
        else:
            p = _on_queue(self.pos_weight, x.queue)
            loss = (1.0 - t) * x + (1.0 + (p - 1.0) * t) * (soft + (-x).relu())
        if self.weight is not None:
            loss = loss * _on_queue(self.weight, x.queue)
        return reduce(loss, self.reduction), None


class L1Loss(_Loss):
    """L1Loss(size_average=None, reduce=None, reduction="mean"): |pred - target|, as torch.nn.L1Loss."""

    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__(reduction, size_average, reduce)

    def composite(self, pred, target):
        """|pred - target|, reduced."""
        t = target if isinstance(target, Tensor) and target.requires_grad else self._target(pred, target)
        return reduce((pred - t).abs(), self.reduction), None


class SmoothL1Loss(_Loss):
    """SmoothL1Loss(size_average=None, reduce=None, reduction="mean", beta=1.0): 0.5 d^2 / beta where
    |d| < beta, else |d| - 0.5 beta (d = pred - target), as torch.nn.SmoothL1Loss (beta 0: L1)."""

    def __init__(self, size_average=None, reduce=None, reduction="mean", beta=1.0):
        super().__init__(reduction, size_average, reduce)
        self.beta = as_float("beta", beta, 0.0)

    def composite(self, pred, target):
        """The elementwise terms, reduced."""
        t = target if isinstance(target, Tensor) and target.requires_grad else self._target(pred, target)
        return reduce(_smooth_l1(pred - t, self.beta), self.reduction), None


def _smooth_l1(diff, beta):
    d = diff.abs()
    if beta == 0.0:
        return d
    small = d < beta  # (0/1: comparisons give float tensors)
    return small * (0.5 / beta) * d * d + (1.0 - small) * (d - 0.5 * beta)


class HuberLoss(_Loss):
    """HuberLoss(reduction="mean", delta=1.0): 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta),
    as torch.nn.HuberLoss."""

    def __init__(self, reduction="mean", delta=1.0):
        super().__init__(reduction)
        self.delta = as_float("delta", delta, 0.0)
        if self.delta <= 0:
            raise ValueError(f"HuberLoss: delta must be positive, got {delta}")

    def composite(self, pred, target):
        """delta times SmoothL1 with beta = delta, reduced."""
        t = target if isinstance(target, Tensor) and target.requires_grad else self._target(pred, target)
        return reduce(_smooth_l1(pred - t, self.delta) * self.delta, self.reduction), None


class _Classes(_Loss):
    """Losses over classes (dimension 1 of the prediction, (N, C) or (N, C, d...)) with class-index
    targets (N, d...): class weights, ignore_index, torch's weighted mean."""

    def __init__(self, weight, size_average, ignore_index, reduce, reduction):
        super().__init__(reduction, size_average, reduce)
        self.weight = _optional_tensor("weight", weight)
        if self.weight is not None and self.weight.ndim != 1:
            raise ValueError(f"{type(self).__name__}: weight must be a 1-D tensor of one weight per class, got shape "
                             f"{self.weight.shape}")
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)) or \
                not -2**31 <= ignore_index < 2**31:
            raise TypeError(f"ignore_index must be an int (int32), got {ignore_index!r:.50}")
        self.ignore_index = int(ignore_index)

    def _check_classes(self, pred):
        self._check_prediction(pred)
        if pred.ndim < 2:
            raise ValueError(f"{type(self).__name__} expects (N, C) or (N, C, d...) predictions, got shape "
                             f"{pred.shape}")
        if self.weight is not None and self.weight.shape != (pred.shape[1],):
            raise ValueError(f"{type(self).__name__}: weight has {self.weight.size} entries, the prediction "
                             f"{pred.shape[1]} classes")

    def _host_classes(self, labels, shape, c):
        """Class indices from the host, checked (integers in [0, c), or ignore_index)."""
        name = type(self).__name__
        y = labels.to_host() if isinstance(labels, Tensor) else np.asarray(labels)
        if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
            raise TypeError(f"{name} labels must be class indices (integers), got dtype {y.dtype}")
        if y.shape != tuple(shape):
            raise ValueError(f"{name} expects {' x '.join(map(str, shape))} class indices, got labels of shape "
                             f"{y.shape}")
        if y.size:
            ok = ((y >= 0) & (y < c) & (np.mod(y, 1) == 0)) | (y == self.ignore_index)
            if not np.all(ok):
                bad = y[~ok]
                raise ValueError(f"{name} labels must be integers in [0, {c}) (class indices) or ignore_index="
                                 f"{self.ignore_index}, got {bad.min()}..{bad.max()}")
        return y

    def _indices(self, pred, target):
        """The class targets as an int32 device tensor of shape (N, d...)."""
        shape, c = (pred.shape[0],) + pred.shape[2:], pred.shape[1]
        if isinstance(target, Tensor) and target.on_device:
            if target.shape != shape:
                raise ValueError(f"{type(self).__name__} expects {' x '.join(map(str, shape))} class indices, got "
                                 f"labels of shape {target.shape}")
            return target if target.dtype == INT32 else functions.cast(target, INT32)
        y = self._host_classes(target, shape, c)
        return functions.tensor(y.astype(np.int64), queue=pred.queue, dtype=INT32)

    def _weights(self, t, c, weighted=True):
        """(each target's class weight, 0 where ignored; a 1-element flag, nonzero where a target
        is neither a class nor ignore_index), from loss.cl's class_weights."""
        q = t.queue
        w, bad = ops.new(q, t.shape), ops.new(q, (1,)).fill_(0.0)
        weight = _on_queue(self.weight, q) if weighted and self.weight is not None else None
        if w.size:
            ops.launch1d(q, "loss", "class_weights", w.size, w.size, c, t,
                         weight if weight is not None else ops.dummy(q), int(weight is not None), self.ignore_index,
                         w, bad)
        return w.mark_written(), bad.mark_written()

    def _nll(self, logp, t, smoothing=0.0):
        """torch's nll_loss of log-probabilities logp (N, C, d...) at int32 targets t, with label
        smoothing as cross_entropy's: (the loss, the refusal flag)."""
        c = logp.shape[1]
        w, bad = self._weights(t, c)
        per = -(_take_classes(logp, t) * w)
        if smoothing:
            mask = w if self.weight is None else self._weights(t, c, weighted=False)[0]
            if self.weight is not None:
                logp = logp * _on_queue(self.weight, logp.queue).reshape((1, c) + (1,) * (logp.ndim - 2))
            per = per * (1.0 - smoothing) + (-logp.sum(1) * mask) * (smoothing / c)
        if self.reduction == "mean":
            return per.sum() / w.sum(), bad
        return reduce(per, self.reduction), bad

    @staticmethod
    def _refuse_classes(name, c, size):
        raise ValueError(f"{name} labels must be integers in [0, {c}) (class indices) or ignore_index; some of the "
                         f"{size} labels on the device are not")

    def _refusal(self, pred):
        return functools.partial(self._refuse_classes, type(self).__name__, pred.shape[1], pred.size // pred.shape[1])

    def check_target(self, target, out_shape):
        """Class indices as the float32 host array netcl.TrainStep uploads, checked as a call checks them."""
        if len(out_shape) < 2:
            raise ValueError(f"{type(self).__name__} expects (N, C) or (N, C, d...) predictions, the model gives "
                             f"{tuple(out_shape)}")
        shape = (out_shape[0],) + tuple(out_shape[2:])
        return self._host_classes(target, shape, out_shape[1]).astype(np.float32)


class NLLLoss(_Classes):
    """NLLLoss(weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"): the
    negative log-likelihood of log-probabilities (N, C) or (N, C, d...) at class indices (N, d...),
    as torch.nn.NLLLoss: the mean is weighted (divided by the sum of the targets' class weights) and
    targets equal to ignore_index count for nothing."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
        super().__init__(weight, size_average, ignore_index, reduce, reduction)

    def composite(self, pred, target):
        """-weight[t] * pred[n, t], reduced (mean: over the weights)."""
        self._check_classes(pred)
        return self._nll(pred, self._indices(pred, target))


class CrossEntropyLoss(_Classes):
    """CrossEntropyLoss(weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
    label_smoothing=0.0): log-softmax over dimension 1 of the logits, then the negative
    log-likelihood of class indices (N, d...), or the cross-entropy with class probabilities (a
    target of the logits' shape), as torch.nn.CrossEntropyLoss. In its plain form (mean, no class
    weights or smoothing) on (N, C) logits with class indices it runs as one kernel."""
    kernel = "cross_entropy"

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0):
        super().__init__(weight, size_average, ignore_index, reduce, reduction)
        self.label_smoothing = as_float("label_smoothing", label_smoothing, 0.0, 1.0)

    @property
    def plain(self):
        """Whether the loss has its plain form (mean, no class weights, no label smoothing)."""
        return self.weight is None and self.label_smoothing == 0.0 and self.reduction == "mean"

    def fused(self, pred, target):
        """The kernel's form: plain, (N, C) logits, class indices."""
        return self.plain and pred.ndim == 2 and not _probabilities(pred, target)

    def composite(self, pred, target):
        """log_softmax, then nll_loss (with smoothing) or the cross-entropy of probabilities."""
        self._check_classes(pred)
        logp = functions.log_softmax(pred, 1)
        if not _probabilities(pred, target):
            return self._nll(logp, self._indices(pred, target), self.label_smoothing)
        if self.ignore_index >= 0:
            raise ValueError("CrossEntropyLoss: ignore_index is not supported for class-probability targets")
        t = target if isinstance(target, Tensor) and target.requires_grad else self._target(pred, target)
        c = pred.shape[1]
        if self.label_smoothing:
            t = t * (1.0 - self.label_smoothing) + self.label_smoothing / c
        prod = logp * t
        if self.weight is not None:
            prod = prod * _on_queue(self.weight, pred.queue).reshape((1, c) + (1,) * (pred.ndim - 2))
        if self.reduction == "none":
            return -prod.sum(1), None
        return (-prod.sum() * (c / pred.size) if self.reduction == "mean" else -prod.sum()), None

    def enqueue(self, logits, labels):
        """As _Loss.enqueue: labels on the host are checked here (ValueError at once); labels on
        the device by the kernel, a refused one getting its row a zero gradient and making item()
        raise."""
        self._check_prediction(logits)
        if not self.fused(logits, labels):
            return super().enqueue(logits, labels)
        self._last = None
        n, c = logits.shape
        on_device = isinstance(labels, Tensor) and labels.on_device
        if not on_device:
            labels = self._host_classes(labels, (n,), c).astype(np.float32)
        elif labels.shape != (n,):
            raise ValueError(f"CrossEntropyLoss expects {n} class indices, got labels of shape {labels.shape}")
        q = logits.queue
        self._grad = ops.new(q, (n, c))
        groups = -(-n // _RED)
        part, out, mean = ops.new(q, (3 * groups,)), ops.new(q, (2,)), ops.new(q, ())
        ops.launch(q, "loss", "cross_entropy", (groups * _RED,), (_RED,), n, c, self.ignore_index, logits,
                   _labels(q, labels), self._grad, part)
        ops.launch(q, "loss", "ce_sum", (_RED,), (_RED,), groups, part, out, mean, n, c, self._grad)
        self._grad.mark_written()
        self._pending = None
        refuse = functools.partial(self._refuse_classes, "CrossEntropyLoss", c, n)
        return PendingLoss(out.mark_written(), 1, refuse, mean.mark_written(), on_device)  # (out[0]: the mean)

    def check_target(self, target, out_shape):
        """As _Classes.check_target; class probabilities (the logits' shape) as float32."""
        shape = np.shape(target.to_host() if isinstance(target, Tensor) else target)
        if tuple(shape) == tuple(out_shape):
            return np.asarray(target.to_host() if isinstance(target, Tensor) else target, np.float32)
        return super().check_target(target, out_shape)

    def enqueue_linear(self, linear, x, labels, input_grad=True):
        """The loss of linear(x) and every gradient of the pair, on a CPU device in one kernel
        (head_cpu.cl; netcl.TrainStep runs a classifier's last Linear this way): returns (the
        logits, a PendingLoss, dL/dx or None without input_grad). linear's parameter gradients are
        written (or added to) as its backward would, and backward() gives dL/dlogits as after
        enqueue(). x: (N, in_features); linear: at most 16 outputs. The plain form only."""
        if type(linear) is not Linear or linear.out_features > 16:
            raise ValueError(f"enqueue_linear takes a Linear with at most 16 outputs, got {linear!r}")
        if not self.plain:
            raise ValueError("enqueue_linear computes the plain CrossEntropyLoss (mean, no class weights, no "
                             "label smoothing)")
        self._check_prediction(x, rank=2)
        q = x.queue
        if not ops.is_cpu(q):
            raise ValueError("enqueue_linear runs on CPU devices (its kernel is one work-item)")
        n, c = x.shape[0], linear.out_features
        logits = ops.new(q, linear.output_shape(x.shape))
        if not (isinstance(labels, Tensor) and labels.on_device):
            labels = self._host_classes(labels, (n,), c).astype(np.float32)
        elif labels.shape != (n,):
            raise ValueError(f"CrossEntropyLoss expects {n} class indices, got labels of shape {labels.shape}")
        self._last = None
        linear._on(x)
        unused, has_bias = ops.dummy(q), linear.bias is not None  # (for the pointers the kernel skips)
        gw, acc_w = ops.grad_target(linear.weight)
        gb, acc_b = ops.grad_target(linear.bias) if has_bias else (unused, False)
        self._grad = ops.new(q, (n, c))
        dx = ops.new(q, x.shape) if input_grad else unused
        padded, wt = ops.new(q, (n, 16)), ops.new(q, (c, linear.in_features)) if input_grad else unused
        out = ops.new(q, (2,))
        ops.launch(q, "head_cpu", "linear_ce_cpu", (1,), (1,), n, linear.in_features, c, x, linear.weight,
                   linear.bias if has_bias else unused, int(has_bias), _labels(q, labels), self.ignore_index, logits,
                   self._grad, padded, wt, gw, int(acc_w), gb, int(acc_b), dx, int(input_grad), out)
        for t in (logits, self._grad, gw, out) + ((gb,) if has_bias else ()):
            t.mark_written()
        linear._x2 = x  # as its forward saves it
        refuse = functools.partial(self._refuse_classes, "CrossEntropyLoss", c, n)
        return logits, PendingLoss(out, 1, refuse), dx.mark_written() if input_grad else None  # (out[0]: the mean)


def _probabilities(pred, target):
    """Whether target holds class probabilities (the prediction's shape) rather than class indices."""
    return tuple(target.shape if isinstance(target, Tensor) else np.shape(target)) == pred.shape


class _TakeBackward(Node):
    def __init__(self, x, idx):
        super().__init__((x,))
        self.shape = x.shape
        self.save(idx)

    def backward(self, dy):
        (idx,) = self.saved_tensors()
        outer, c, inner = self.shape[0], self.shape[1], int(np.prod(self.shape[2:], dtype=np.int64))
        return (array_ops.take_backward(dy, idx, outer, c, inner)._view(self.shape),)


def _take_classes(x, target):
    """x[n, target[n, ...], ...]: the score of each target class, (N, d...) (0 where the target is
    not a class)."""
    outer, c, inner = x.shape[0], x.shape[1], int(np.prod(x.shape[2:], dtype=np.int64))
    y = array_ops.take(x, target, outer, c, inner)._view(target.shape)
    return attach(_TakeBackward(x, target), y) if autograd.needs_record(x) else y
