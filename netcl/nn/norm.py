"""BatchNorm2d and BatchNorm1d (batch statistics in training, running statistics in eval) and LayerNorm
(kernels/norm.cl); GroupNorm and InstanceNorm2d (kernels/groupnorm.cl)."""
import math

from netcl import ops
from netcl.act import Act
from netcl.nn.module import Module, as_bool, as_float, check_rank, constant, positive
from netcl.nn.pool import MaxPool2d, _pool2_rows
from netcl.runtime import alloc, tiers

# Values per part of a channel in the two-stage reductions (kernels/norm.cl, norm_cpu.cl): a GPU
# wants thousands of work-groups even for 16 channels; a CPU fewer, larger parts (a part's second
# pass reads from its L2 cache; 16K floats = 64 KiB).
PART_LEN = {"gpu": 4096, "cpu": 16384}
# A CPU backward runs in one launch, a work-item per channel (bn_bwd_channel_cpu), where a channel's
# x and dy fit in this much of a core's L2 together and there are channels enough for every core
# (_CHANNEL_ITEMS per compute unit): its second pass then reads them from L2.
_CHANNEL_L2, _CHANNEL_ITEMS = 1024 * 1024, 4


def _parts(q, m):
    """(values per part, parts) for a channel of m values."""
    length = PART_LEN["cpu" if ops.is_cpu(q) else "gpu"]
    return length, -(-m // length)


def _check_pad(pad, h, w):
    """ValueError unless padded planes pad = (top, left, HP, WP) hold an h x w plane (or pad is None)."""
    if pad is not None and (pad[0] + h > pad[2] or pad[1] + w > pad[3]):
        raise ValueError(f"BatchNorm2d: planes {pad[2]}x{pad[3]} cannot hold {h}x{w} at row {pad[0]}, column {pad[1]}")


def pools_in_norm(pool, q, shape):
    """Whether a training BatchNorm2d (+ activation) on `shape` can run the MaxPool2d `pool` after
    it in its element-wise pass: a CPU, and the 2x2 stride-2 unpadded windows of pool_cpu.cl."""
    return type(pool) is MaxPool2d and _pool2_rows(q, pool._geometry(shape)) is not None


def _act_options(act):
    """Build options of the BatchNorm kernels fused with activation `act` (kernels/bn_act.h); none for
    plain BatchNorm, whose program the other norm kernels share."""
    return () if act == Act.NONE else (f"-DACT_KIND={int(act)}", f"-DACT_OUT={int(act.saves_output)}")


def _grad_pair(weight, bias):
    """(dgamma, dbeta, accumulate) for the kernels that write both under one flag. Where only one of
    them already holds a gradient (a user set it, or cleared the other), the other starts from zeros
    and both accumulate: one flag for both had added dbeta onto a recycled buffer's contents, or
    overwritten a bias gradient that was there."""
    gw, acc_w = ops.grad_target(weight)
    gb, acc_b = ops.grad_target(bias)
    if acc_w != acc_b:
        (gb if acc_w else gw).fill_(0.0)
    return gw, gb, acc_w or acc_b


class BatchNorm2d(Module):
    # x: (N, C, H, W) -> same; batch statistics in training, running statistics in eval
    """BatchNorm2d(num_features, eps=1e-5, momentum=0.1): (N, C, H, W) normalised per channel with batch statistics in training (running statistics updated as PyTorch, unbiased variance) and the running ones in eval."""
    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.num_features = positive("num_features", num_features)
        self.eps, self.momentum = as_float("eps", eps), as_float("momentum", momentum)
        if not (0.0 < self.eps < math.inf and 0.0 <= self.momentum <= 1.0):
            raise ValueError(f"BatchNorm2d needs eps > 0 (finite) and momentum in [0, 1], got eps={eps}, "
                             f"momentum={momentum}")
        init = {"weight": 1.0, "bias": 0.0, "running_mean": 0.0, "running_var": 1.0}
        for name, shape in self.tensor_shapes(self.num_features).items():
            setattr(self, name, constant(init[name], shape, parameter=name in ("weight", "bias")))
        self._params = {"weight": self.weight, "bias": self.bias}
        self._buffers = {"running_mean": self.running_mean, "running_var": self.running_var}

    @classmethod
    def tensor_shapes(cls, num_features, eps=1e-5, momentum=0.1):
        c = (num_features,)
        return {"weight": c, "bias": c, "running_mean": c, "running_var": c}

    def config(self):
        return {"num_features": self.num_features, "eps": self.eps, "momentum": self.momentum}

    def output_shape(self, shape):
        check_rank("BatchNorm2d", shape, 4, "(N, C, H, W)")
        if shape[1] != self.num_features:
            raise ValueError(f"BatchNorm2d expects {self.num_features} channels, got shape {tuple(shape)}")
        return tuple(shape)

    def forward(self, x, act=None, pool=None, pad=None, stats=None):
        """y = BatchNorm(x), or act(BatchNorm(x)) in the same pass when given `act`, the activation
        layer that follows (Sequential's training path: one pass instead of two, and backward
        differentiates through both without the activation's saved tensor). With `pool`, the
        MaxPool2d after the activation (2x2, stride 2, on a CPU: pools_in_norm; Sequential's
        training forward, whether this BatchNorm uses batch or running statistics), the pass
        returns the pooled result and leaves the pool what its backward reads; the BatchNorm's
        own output is not stored. With `pad` (top, left, HP, WP), on a CPU, the output goes into
        zero-bordered planes (N, C, HP, WP) at row top, column left: the padded input of the
        convolution after it (Conv2d.padded_input, then forward_padded). With `stats` (part,
        parts, values per part, part_major), on a CPU in training, the batch statistics' parts of x
        as the kernel that wrote x computed them (Conv2d.output_statistics): combined by one launch
        (bn_stats_finish) instead of read from x again."""
        code, slope = (Act.NONE, 0.0) if act is None else (Act(act.act), float(act.slope))
        options = _act_options(code)
        q = self._on(x)
        BatchNorm2d.output_shape(self, x.shape)  # (BatchNorm1d's (N, C, L, 1) views too)
        n, c, h, w = x.shape
        if self.training and n * h * w < 2:
            raise ValueError(f"BatchNorm2d in training needs more than one value per channel, got input {x.shape}")
        cpu = ops.is_cpu(q)  # CPUs: norm_cpu.cl's vector kernels for the part sums and element-wise passes
        if pad is not None and (pool is not None or not cpu):
            raise ValueError("BatchNorm2d writes padded planes on CPUs only, and not with a pool")
        _check_pad(pad, h, w)
        y = ops.new(q, x.shape if pad is None else (n, c) + tuple(pad[2:])) if pool is None else None
        if self.training:
            mean, var = ops.new(q, (c,)), ops.new(q, (c,))
            if cpu:  # the second stage inside the element-wise pass (norm_cpu.cl), or before the pooled one
                part, parts, length = self._stats_parts(x) if stats is None else stats[:3]
                stage2 = (part, parts, length, self.running_mean, self.running_var, self.momentum)
                if stats is not None:  # many parts: combined once, not per plane
                    self._finish_stats(stats, n * h * w, mean, var)
                elif pool is not None:
                    self._finish_stats((part, parts, length, False), n * h * w, mean, var)
                if stats is not None or pool is not None:
                    stage2 = (ops.dummy(q), 0, 0, ops.dummy(q), ops.dummy(q), 0.0)
            else:  # GPUs: the statistics' second stage runs inside the element-wise pass (a launch less)
                length, parts = _parts(q, n * h * w)
                part = ops.new(q, (c, parts, 2))
                ops.launch(q, "norm", "bn_stats_part", (parts * 64, c), (64, 1), n, c, h * w, length, x, part)
                ops.launch(q, "norm", "bn_apply_batch", (parts * 64, c), (64, 1), n, c, h * w, length, parts, part,
                           x, mean, var, self.running_mean, self.running_var, self.momentum, self.weight, self.bias,
                           self.eps, slope, y, options=options)
            self.running_mean.mark_written()
            self.running_var.mark_written()
        else:
            mean, var = self.running_mean, self.running_var
        if cpu and not self.training:  # the statistics as they are
            stage2 = (ops.dummy(q), 0, 0, ops.dummy(q), ops.dummy(q), 0.0)
        if pool is not None:
            assert pools_in_norm(pool, q, x.shape), "Sequential pairs only what pools_in_norm allows"
            g = pool._geometry(x.shape)
            items, rows = _pool2_rows(q, g)
            nc, oh, ow = g[0], g[-2], g[-1]
            y = ops.new(q, pool.output_shape(x.shape))
            arg = alloc(q, 4 * y.size)
            ops.launch(q, "pool_cpu", "bn_maxpool2_cpu", (items,), (1,), nc * oh, rows, c, h, w, oh, ow, x, mean, var,
                       self.weight, self.bias, self.eps, slope, y, arg, options=options)
            pool._saved = (x.shape, g, arg)
        elif pad is not None:
            planes, items = ops.cpu_rows(n * c, pad[2] * pad[3])
            ops.launch(q, "norm_cpu", "bn_apply_pad_cpu", (items,), (1,), n * c, planes, c, h, w, pad[2], pad[3],
                       pad[0], pad[1], x, mean, var, self.weight, self.bias, self.eps, slope, y, *stage2,
                       options=options)
        elif cpu:
            chunk, items = ops.cpu_chunk(x.size)
            ops.launch(q, "norm_cpu", "bn_apply_cpu", (items,), (1,), x.size, chunk, c, h * w, x, mean, var,
                       self.weight, self.bias, self.eps, slope, y, *stage2, options=options)
        elif not self.training:
            ops.launch1d(q, "norm", "bn_apply", x.size, n, c, h * w, x, mean, var, self.weight, self.bias, self.eps,
                         slope, y, options=options)
        if self.training and cpu:
            mean.mark_written()  # by the element-wise pass (or the pooled path's bn_stats_finish)
            var.mark_written()
        self._saved = (x, mean, var, self.training, code, slope)
        return y.mark_written()

    def _finish_stats(self, stats, m, mean, var):
        """mean and var of each channel (m values) from its parts stats = (part, parts, values per
        part, part_major), the running statistics updated (bn_stats_finish_cpu; bn_stats_finish_pm_cpu
        for part-major parts of 16k channels). part_major: a part's channels lie together (corr_cpu's
        and corrc_cpu's), else a channel's parts."""
        part, parts, length, part_major = stats
        c = self.num_features
        if part_major:
            _own_stats_later(mean.queue)
        if part_major and c % 16 == 0 and parts * length == m:  # 16 channels a work-item, in the lanes
            ops.launch(mean.queue, "norm_cpu", "bn_stats_finish_pm_cpu", (c // 16,), (1,), m, c, parts, length, part,
                       mean, var, self.running_mean, self.running_var, self.momentum)
            return
        cs, ps = (1, c) if part_major else (parts, 1)
        ops.launch(mean.queue, "norm_cpu", "bn_stats_finish_cpu", (c,), (1,), m, parts, length, part,
                   cs, ps, mean, var, self.running_mean, self.running_var, self.momentum)

    def _stats_parts(self, x):
        """(part, parts, values per part): x's batch-statistics parts per channel (bn_stats_part_cpu)."""
        n, c, h, w = x.shape
        length, parts = _parts(x.queue, n * h * w)
        part = ops.new(x.queue, (c, parts, 2))
        ops.launch(x.queue, "norm_cpu", "bn_stats_part_cpu", (parts, c), (1, 1), n, c, h * w, length, x, part)
        return part.mark_written(), parts, length

    def statistics(self, x, stats=None):
        """The training forward on a CPU up to its element-wise pass: the batch statistics' parts
        (bn_stats_part_cpu; in eval mode the running statistics as they are) and what backward
        reads saved, as forward saves it (`stats`: as forward's). Returns that pass's arguments (x, mean, var, weight,
        bias, eps, parts, parts per channel, values per part, running mean, running var,
        momentum) for a kernel that applies this BatchNorm2d in its own pass and writes no
        output of it (norm_cpu.cl's bn_add_act_cpu: a Residual's sum); that kernel writes mean
        and var (and the running statistics), and its caller marks them (written_by_pass)."""
        q = self._on(x)
        self.output_shape(x.shape)
        n, c, h, w = x.shape
        if not ops.is_cpu(q):
            raise ValueError("BatchNorm2d.statistics: the deferred element-wise pass runs on CPUs only")
        if not self.training:
            self._saved = (x, self.running_mean, self.running_var, False, Act.NONE, 0.0)
            return (x, self.running_mean, self.running_var, self.weight, self.bias, self.eps, ops.dummy(q), 0, 0,
                    ops.dummy(q), ops.dummy(q), 0.0)
        if n * h * w < 2:
            raise ValueError(f"BatchNorm2d in training needs more than one value per channel, got input {x.shape}")
        mean, var = ops.new(q, (c,)), ops.new(q, (c,))
        self._saved = (x, mean, var, True, Act.NONE, 0.0)
        if stats is not None:  # forward's `stats`: combined here, the pass reads mean and var
            self._finish_stats(stats, n * h * w, mean, var)
            d = ops.dummy(q)
            return x, mean, var, self.weight, self.bias, self.eps, d, 0, 0, d, d, 0.0
        part, parts, length = self._stats_parts(x)
        return (x, mean, var, self.weight, self.bias, self.eps, part, parts, length, self.running_mean,
                self.running_var, self.momentum)

    def written_by_pass(self):
        """Mark what the element-wise pass that statistics() handed out wrote (a training one)."""
        _, mean, var, training = self._saved[:4]
        if training:
            for t in (mean, var, self.running_mean, self.running_var):
                t.mark_written()

    def backward(self, dy, pool=None, pad=None, wgrad=None):
        """dx from dy; with `pool`, the MaxPool2d its forward ran (forward(pool=...)): dy is then the
        pool's output gradient, routed through the pool's argmax inside both passes. With `pool` and
        `wgrad`, the Conv2d before this layer: where its pool_wgrad() applies, its weight and bias
        gradients instead of dx, which is never stored (returns None); else dx as without it. With `pad`
        (top, left, HP, WP), on a CPU, dx goes into zero-bordered planes (N, C, HP, WP) at row
        top, column left (with a pool too): the padded output gradient of the convolution before it
        (Conv2d.padded_grad, then backward_padded)."""
        x, mean, var, training, code, slope = self._saved  # eval mode (frozen statistics) differentiates as torch does
        if pool is not None:
            return self._backward_pooled(dy, pool, wgrad, pad)
        if wgrad is not None:
            raise ValueError("BatchNorm2d.backward(wgrad=...) needs the pool its forward ran (pool=...)")
        options = _act_options(code)
        n, c, h, w = x.shape
        if pad is not None and not ops.is_cpu(dy.queue):
            raise ValueError("BatchNorm2d writes padded planes on CPUs only")
        _check_pad(pad, h, w)
        dx = ops.new(dy, dy.shape if pad is None else (n, c) + tuple(pad[2:]))
        gw, gb, acc_w = _grad_pair(self.weight, self.bias)
        q = dy.queue
        length, parts = _parts(q, n * h * w)
        cpu = ops.is_cpu(q)
        if cpu and 8 * n * h * w <= _CHANNEL_L2 and c >= _CHANNEL_ITEMS * ops.compute_units(q):
            top, left, hp, wp = pad if pad is not None else (0, 0, h, w)
            ops.launch(q, "norm_cpu", "bn_bwd_channel_cpu", (c,), (1,), n, c, h, w, hp, wp, top, left, x, dy, mean,
                       var, self.weight, self.bias, self.eps, slope, gw, gb, int(acc_w), dx, int(training),
                       options=options)
            gw.mark_written()
            gb.mark_written()
            return dx.mark_written()
        part = ops.new(q, (c, parts, 2))
        if cpu:  # the sums' second stage inside the element-wise pass (norm_cpu.cl)
            ops.launch(q, "norm_cpu", "bn_bwd_part_cpu", (parts, c), (1, 1), n, c, h * w, length, x, dy, mean, var,
                       self.weight, self.bias, self.eps, slope, part, options=options)
            stage2 = (part, parts, gw, gb, int(acc_w), dx, int(training))
            if pad is not None:
                planes, items = ops.cpu_rows(n * c, pad[2] * pad[3])
                ops.launch(q, "norm_cpu", "bn_bwd_apply_pad_cpu", (items,), (1,), n * c, planes, c, h, w, pad[2],
                           pad[3], pad[0], pad[1], x, dy, mean, var, self.weight, self.bias, self.eps, slope, *stage2,
                           options=options)
            else:
                chunk, items = ops.cpu_chunk(dx.size)
                ops.launch(q, "norm_cpu", "bn_bwd_apply_cpu", (items,), (1,), dx.size, chunk, c, h * w, x, dy, mean,
                           var, self.weight, self.bias, self.eps, slope, *stage2, options=options)
            gw.mark_written()
            gb.mark_written()
            return dx.mark_written()
        sums = ops.new(q, (c, 2)) if not training else None  # the second stage's result, between launches
        ops.launch(q, "norm", "bn_bwd_part", (parts * 64, c), (64, 1), n, c, h * w, length, x, dy, mean, var,
                   self.weight, self.bias, self.eps, slope, part, options=options)
        if training:  # GPUs: the sums' second stage runs inside the element-wise pass
            ops.launch(q, "norm", "bn_bwd_apply_batch", (parts * 64, c), (64, 1), n, c, h * w, length, parts, part,
                       x, dy, mean, var, self.weight, self.bias, self.eps, slope, gw, gb, int(acc_w), dx,
                       options=options)
        else:
            ops.launch(q, "norm", "bn_bwd_finish", (c * 64,), (64,), parts, part, var, self.eps, gw, gb, int(acc_w),
                       sums)
            ops.launch1d(q, "norm", "bn_bwd_apply", dx.size, n, c, h * w, x, dy, mean, var, self.weight, self.bias,
                         self.eps, slope, sums, dx, int(training), options=options)
        gw.mark_written()
        gb.mark_written()
        return dx.mark_written()

    def _backward_pooled(self, dp, pool, conv=None, pad=None, psum=None):
        """backward() through the fused pool (norm_cpu.cl's bn_pool_bwd_* kernels): its gradient
        per input is made where needed, never stored. With `conv` (whose pool_wgrad() applies),
        that conv's dW and db in the last pass (bn_pool_bwd_wgrad_cpu) instead of dx. With `pad`
        (top, left, HP, WP), dx goes into zero-bordered planes (N, C, HP, WP), as backward(pad=...)
        writes them (bn_pool_bwd_apply_pad_cpu), and psum (N * C), where given, gets each plane's
        sum: the bias gradient per image of the conv whose output gradient dx is."""
        x, mean, var, training, code, slope = self._saved
        shape, g, arg = pool._saved
        if shape != x.shape or dp.shape != pool.output_shape(shape):
            raise RuntimeError("BatchNorm2d.backward(pool=...) needs the forward that ran that pool")
        options = _act_options(code)
        n, c, h, w = x.shape
        nc, oh, ow = g[0], g[-2], g[-1]
        q = dp.queue
        fused = conv.pool_wgrad(q, x.shape) if conv is not None else None
        gw, gb, acc = _grad_pair(self.weight, self.bias)
        prow = max(1, PART_LEN["cpu"] // (2 * w))  # pooled rows per part: each two input rows
        parts = -(-n * oh // prow)
        part, sums = ops.new(q, (c, parts, 2)), ops.new(q, (c, 2))
        ops.launch(q, "norm_cpu", "bn_pool_bwd_part_cpu", (parts, c), (1, 1), n, c, h, w, oh, ow, prow, x, dp, arg,
                   mean, var, self.weight, self.bias, self.eps, slope, part, options=options)
        ops.launch(q, "norm_cpu", "bn_bwd_finish_cpu", (c,), (1,), parts, part, var, self.eps, gw, gb, int(acc), sums)
        gw.mark_written()
        gb.mark_written()
        if fused is not None:
            self._conv_grads_pooled(conv, fused, dp, arg, sums)
            return None
        if pad is not None:
            _check_pad(pad, h, w)
            top, left, hp, wp = pad
            dx = ops.new(q, (n, c, hp, wp))
            planes, items = ops.cpu_rows(nc, hp * wp)
            ops.launch(q, "norm_cpu", "bn_pool_bwd_apply_pad_cpu", (items,), (1,), nc, planes, c, h, w, oh, ow, hp, wp,
                       top, left, x, dp, arg, mean, var, self.weight, self.bias, self.eps, slope, sums, dx,
                       int(training), psum if psum is not None else ops.dummy(q), int(psum is not None),
                       options=options)
            if psum is not None:
                psum.mark_written()
            return dx.mark_written()
        dx = ops.new(q, x.shape)
        items, rows = _pool2_rows(q, g)
        ops.launch(q, "norm_cpu", "bn_pool_bwd_apply_cpu", (items,), (1,), nc * oh, rows, c, h, w, oh, ow, x, dp, arg,
                   mean, var, self.weight, self.bias, self.eps, slope, sums, dx, int(training), options=options)
        return dx.mark_written()

    def _conv_grads_pooled(self, conv, fused, dp, arg, sums):
        """_backward_pooled's last pass as conv's dW and db (bn_pool_bwd_wgrad_cpu): a work-item per
        channel, every _CHANNEL_ITEMS * compute units-th after it."""
        x, mean, var, training, code, slope = self._saved
        (conv_options, xp), q = fused, dp.queue
        n, c, h, _ = x.shape
        gw, acc_w = ops.grad_target(conv.weight)
        gb, acc_b = ops.grad_target(conv.bias) if conv.bias is not None else (ops.dummy(q), False)
        ops.launch(q, "norm_cpu", "bn_pool_bwd_wgrad_cpu", (min(c, _CHANNEL_ITEMS * ops.compute_units(q)),), (1,),
                   n, c, h, x, dp, arg, mean, var, self.weight, self.bias, self.eps, slope, sums, int(training), xp,
                   xp.shape[2], xp.shape[3], gw, gb, int(conv.bias is not None), int(acc_w), int(acc_b),
                   options=_act_options(code) + conv_options)
        gw.mark_written()
        if conv.bias is not None:
            gb.mark_written()


class LayerNorm(Module):
    # x: (..., D) -> same, normalised over the last dimension (biased variance), then * weight + bias
    """LayerNorm(normalized_shape, eps=1e-5): (..., D) normalised over the last dimension (biased variance), then * weight + bias."""
    def __init__(self, normalized_shape, eps=1e-5):
        super().__init__()
        if isinstance(normalized_shape, (tuple, list)):  # PyTorch's form; netcl normalises one dimension
            if len(normalized_shape) != 1:
                raise ValueError(f"LayerNorm normalises the last dimension only: normalized_shape must be an "
                                 f"int or a 1-tuple, got {normalized_shape!r}")
            normalized_shape = normalized_shape[0]
        self.normalized_shape = positive("normalized_shape", normalized_shape)
        self.eps = as_float("eps", eps)
        if not self.eps > 0.0:
            raise ValueError(f"LayerNorm needs eps > 0, got {eps}")
        shapes = self.tensor_shapes(self.normalized_shape)
        self.weight, self.bias = constant(1.0, shapes["weight"]), constant(0.0, shapes["bias"])
        self._params = {"weight": self.weight, "bias": self.bias}

    @classmethod
    def tensor_shapes(cls, normalized_shape, eps=1e-5):
        return {"weight": (normalized_shape,), "bias": (normalized_shape,)}

    def config(self):
        return {"normalized_shape": self.normalized_shape, "eps": self.eps}

    def output_shape(self, shape):
        if len(shape) < 1 or shape[-1] != self.normalized_shape:
            raise ValueError(f"LayerNorm({self.normalized_shape}) expects input (..., {self.normalized_shape}), "
                             f"got {tuple(shape)}")
        return tuple(shape)

    def forward(self, x):
        q = self._on(x)
        self.output_shape(x.shape)
        d = self.normalized_shape
        m = x.size // d
        y, mean, rstd = ops.new(q, x.shape), ops.new(q, (m,)), ops.new(q, (m,))
        if ops.is_cpu(q):  # rows per work-item (norm_cpu.cl): a work-group per row costs PoCL ~1.7 us a row
            rows, items = ops.cpu_rows(m, d)
            ops.launch(q, "norm_cpu", "ln_fwd_cpu", (items,), (1,), m, d, rows, x, self.weight, self.bias, self.eps,
                       y, mean, rstd)
        else:
            ops.launch(q, "norm", "ln_fwd", (m * 64,), (64,), m, d, x, self.weight, self.bias, self.eps, y, mean,
                       rstd)
        self._saved = (x, mean.mark_written(), rstd.mark_written())
        return y.mark_written()

    def backward(self, dy):
        x, mean, rstd = self._saved
        d = self.normalized_shape
        m = x.size // d
        dx, q = ops.new(dy, dy.shape), dy.queue
        gw, gb, acc_w = _grad_pair(self.weight, self.bias)
        if ops.is_cpu(q):
            rows, items = ops.cpu_rows(m, d)
            ops.launch(q, "norm_cpu", "ln_bwd_dx_cpu", (items,), (1,), m, d, rows, x, dy, self.weight, mean, rstd, dx)
            ops.launch(q, "norm_cpu", "ln_bwd_params_cpu", (d,), (1,), m, d, x, dy, mean, rstd, gw, gb, int(acc_w))
        else:
            ops.launch(q, "norm", "ln_bwd_dx", (m * 64,), (64,), m, d, x, dy, self.weight, mean, rstd, dx)
            ops.launch(q, "norm", "ln_bwd_params", (d * 64,), (64,), m, d, x, dy, mean, rstd, gw, gb, int(acc_w))
        gw.mark_written()
        gb.mark_written()
        return dx.mark_written()


class BatchNorm1d(BatchNorm2d):
    # x: (N, C) or (N, C, L) -> same; BatchNorm2d's kernels on the view (N, C, L, 1), which is exact:
    # they walk a channel's N * H * W values whatever H and W are
    """BatchNorm1d(num_features, eps=1e-5, momentum=0.1): (N, C) or (N, C, L) normalised per channel with batch statistics in training (running statistics updated as PyTorch, unbiased variance) and the running ones in eval."""

    def output_shape(self, shape):
        if len(shape) not in (2, 3):
            raise ValueError(f"BatchNorm1d expects a 2-D input (N, C) or a 3-D input (N, C, L), got shape {tuple(shape)}")
        if shape[1] != self.num_features:
            raise ValueError(f"BatchNorm1d expects {self.num_features} channels, got shape {tuple(shape)}")
        return tuple(shape)

    @staticmethod
    def _planes(shape):
        return (shape[0], shape[1], shape[2] if len(shape) == 3 else 1, 1)

    def forward(self, x):
        self.output_shape(x.shape)
        if self.training and x.size // self.num_features < 2:
            raise ValueError(f"BatchNorm1d in training needs more than one value per channel, got input {x.shape}")
        return super().forward(x._view(self._planes(x.shape)))._view(x.shape)

    def backward(self, dy):
        return super().backward(dy._view(self._planes(dy.shape)))._view(dy.shape)


class GroupNorm(Module):
    # x: (N, C, *) -> same; each image's C/G channels of a group normalised together over them and every
    # position (biased variance), then * weight[c] + bias[c]
    """GroupNorm(num_groups, num_channels, eps=1e-5, affine=True): (N, C, *) normalised over each group of
    C/num_groups channels and all positions (biased variance), then a per-channel weight and bias (when
    affine), as torch.nn.GroupNorm. The same in training and eval (no running statistics)."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True):
        super().__init__()
        self.num_groups = positive("num_groups", num_groups)
        self.num_channels = positive("num_channels", num_channels)
        if self.num_channels % self.num_groups:
            raise ValueError(f"{type(self).__name__}: num_channels ({num_channels}) must be divisible by num_groups "
                             f"({num_groups})")
        self.eps = as_float("eps", eps)
        if not self.eps > 0.0:
            raise ValueError(f"{type(self).__name__} needs eps > 0, got {eps}")
        self.affine = as_bool("affine", affine)
        shapes = GroupNorm.tensor_shapes(self.num_groups, self.num_channels, affine=self.affine)  # (not a subclass's)
        self.weight = constant(1.0, shapes["weight"]) if self.affine else None
        self.bias = constant(0.0, shapes["bias"]) if self.affine else None
        self._params = {"weight": self.weight, "bias": self.bias} if self.affine else {}

    @classmethod
    def tensor_shapes(cls, num_groups, num_channels, eps=1e-5, affine=True):
        return {"weight": (num_channels,), "bias": (num_channels,)} if affine else {}

    def config(self):
        return {"num_groups": self.num_groups, "num_channels": self.num_channels, "eps": self.eps,
                "affine": self.affine}

    def output_shape(self, shape):
        if len(shape) < 2 or shape[1] != self.num_channels:
            raise ValueError(f"GroupNorm expects input (N, {self.num_channels}, *), got shape {tuple(shape)}")
        return tuple(shape)

    def _sizes(self, shape):
        """(rows N*G, values per row, positions S, G, channels per group)."""
        s = math.prod(shape[2:])
        cg = self.num_channels // self.num_groups
        return shape[0] * self.num_groups, cg * s, s, self.num_groups, cg

    def forward(self, x):
        q = self._on(x)
        self.output_shape(x.shape)
        rows, d, s, g, cg = self._sizes(x.shape)
        y, mean, rstd = ops.new(q, x.shape), ops.new(q, (max(rows, 1),)), ops.new(q, (max(rows, 1),))
        w, b = (self.weight, self.bias) if self.affine else (ops.dummy(q), ops.dummy(q))
        if x.size and ops.is_cpu(q):  # a work-item per row; GPUs a work-group per row
            ops.launch1d(q, "groupnorm", "gn_fwd", rows, rows, d, s, g, cg, x, w, b, int(self.affine), self.eps, y,
                         mean, rstd)
        elif x.size:
            ops.launch(q, "groupnorm", "gn_fwd_wg", (rows * 64,), (64,), rows, d, s, g, cg, x, w, b,
                       int(self.affine), self.eps, y, mean, rstd)
        self._saved = (x, mean.mark_written(), rstd.mark_written())
        return y.mark_written()

    def backward(self, dy):
        x, mean, rstd = self._saved
        q = dy.queue
        rows, d, s, g, cg = self._sizes(x.shape)
        dx = ops.new(dy, dy.shape)
        w = self.weight if self.affine else ops.dummy(q)
        cpu, c = ops.is_cpu(q), self.num_channels
        if dx.size and cpu:
            ops.launch1d(q, "groupnorm", "gn_bwd_dx", rows, rows, d, s, g, cg, x, dy, w, int(self.affine), mean, rstd,
                         dx)
        elif dx.size:
            ops.launch(q, "groupnorm", "gn_bwd_dx_wg", (rows * 64,), (64,), rows, d, s, g, cg, x, dy, w,
                       int(self.affine), mean, rstd, dx)
        if self.affine:
            gw, gb, acc = _grad_pair(self.weight, self.bias)
            if cpu:
                ops.launch1d(q, "groupnorm", "gn_bwd_params", c, x.shape[0], c, s, g, cg, x, dy, mean, rstd, gw, gb,
                             int(acc))
            else:
                ops.launch(q, "groupnorm", "gn_bwd_params_wg", (c * 64,), (64,), x.shape[0], c, s, g, cg, x, dy, mean,
                           rstd, gw, gb, int(acc))
            gw.mark_written()
            gb.mark_written()
        return dx.mark_written()


class InstanceNorm2d(GroupNorm):
    # x: (N, C, H, W) -> same; each image's channel normalised over its positions: GroupNorm with C groups
    """InstanceNorm2d(num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False): (N, C, H, W)
    normalised per image and channel over the positions (biased variance), then a per-channel weight and bias
    when affine, as torch.nn.InstanceNorm2d; GroupNorm's kernels with one channel per group. Batch statistics
    in eval too: track_running_stats=True (running statistics) is not supported, and momentum is unused."""

    RANK, SHAPE = 4, "(N, C, H, W)"  # the input InstanceNorm2d takes (InstanceNorm1d: 3, (N, C, L))

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False):
        if as_bool("track_running_stats", track_running_stats):
            name = type(self).__name__
            raise ValueError(f"{name}: track_running_stats=True is not supported (netcl's {name} keeps no running "
                             "statistics: it normalises with each sample's own, in eval too)")
        as_float("momentum", momentum)
        num_features = positive("num_features", num_features)
        super().__init__(num_features, num_features, eps, affine)
        self.num_features = num_features

    @classmethod
    def tensor_shapes(cls, num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False):
        return {"weight": (num_features,), "bias": (num_features,)} if affine else {}

    def config(self):
        return {"num_features": self.num_features, "eps": self.eps, "affine": self.affine}

    def output_shape(self, shape):
        name = type(self).__name__
        check_rank(name, shape, self.RANK, self.SHAPE)
        if shape[1] != self.num_features:
            raise ValueError(f"{name} expects {self.num_features} channels, got shape {tuple(shape)}")
        return tuple(shape)

    def forward(self, x):
        if self.training and x.ndim == self.RANK and math.prod(x.shape[2:]) == 1:  # (torch refuses it too)
            raise ValueError(f"{type(self).__name__} in training needs more than one position per channel, got "
                             f"input {tuple(x.shape)}")
        return super().forward(x)

    def backward(self, dy):
        return super().backward(dy)


class InstanceNorm1d(InstanceNorm2d):
    # x: (N, C, L) -> same; each sample's channel normalised over its positions
    """InstanceNorm1d(num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False): (N, C, L)
    normalised per sample and channel over the positions, as torch.nn.InstanceNorm1d; InstanceNorm2d's
    (GroupNorm's) kernels, the same settings refused."""
    RANK, SHAPE = 3, "(N, C, L)"


_own_stats_queued = set()  # contexts whose other statistics kernels were handed to the background


def _own_stats_later(q):
    """Where a BatchNorm2d's statistics came from the conv before it, hand the statistics kernels
    other shapes take to the background builds: its own pass over x (bn_stats_part_cpu: an input
    size whose rows do not fill that conv's tiles) and the combination of parts of any channel
    count (bn_stats_finish_cpu: a width not a multiple of 16). A new input size or width then finds
    them built (background mode: eager builds nothing it does not run)."""
    ctx = q.context.int_ptr
    if ctx not in _own_stats_queued and tiers.mode() == "background":
        _own_stats_queued.add(ctx)
        tiers.build_later(q, [("norm_cpu", "bn_stats_part_cpu", ()), ("norm_cpu", "bn_stats_finish_cpu", ())])
