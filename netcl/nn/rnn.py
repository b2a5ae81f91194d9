"""LSTM and GRU, as torch.nn.LSTM and torch.nn.GRU (kernels/rnn.cl).

Per layer and direction the input projections of every time step are one GEMM, x @ W_ih^T + b_ih;
each time step is then a GEMM of the recurrent product (h_{t-1} @ W_hh^T, netcl's tuned GEMM) and one
launch of rnn.cl (the gates and the state update). The backward walks the steps in reverse, likewise
(dg_{t+1} @ W_hh, then the gates' gradients), and ends in GEMMs over all the steps: the weights'
gradients, the biases' sums, the input's gradient. Work runs time-major,
(T, B, features); batch_first input and output are transposed at the edges.

Parameters keep PyTorch's names, shapes and layouts (weight_ih_l{k}[_reverse] (G*H, in),
weight_hh_l{k} (G*H, H), bias_ih_l{k}, bias_hh_l{k} (G*H,), G = 4 for LSTM (gates i, f, g, o), 3
for GRU (r, z, n)), so a torch state dict loads as it is.
"""
import math

from netcl import array_ops, autograd, ops
from netcl.nn.basic import _seed
from netcl.nn.module import Module, as_bool, as_float, positive, uniform
from netcl.tensor import Tensor


class _Ctx:
    """What one call's forward keeps for its backward."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class _RNNBase(Module):
    GATES = 0  # 4 (LSTM) or 3 (GRU)
    CALL_STATE = ()  # a call's state lives in its autograd node (RNNCall), not on the layer

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0):
        super().__init__()
        name = type(self).__name__
        if proj_size != 0:
            raise NotImplementedError(f"{name}: proj_size={proj_size!r} is not supported (only proj_size=0)")
        self.input_size = positive("input_size", input_size)
        self.hidden_size = positive("hidden_size", hidden_size)
        self.num_layers = positive("num_layers", num_layers)
        self.bias = as_bool("bias", bias)
        self.batch_first = as_bool("batch_first", batch_first)
        self.dropout = as_float("dropout", dropout, 0.0, 1.0)
        self.bidirectional = as_bool("bidirectional", bidirectional)
        bound = 1.0 / math.sqrt(self.hidden_size)  # torch's initialisation: U(-1/sqrt(H), 1/sqrt(H)) for all
        for key, shape in self.tensor_shapes(**self.config()).items():
            setattr(self, key, uniform(bound, shape))

    def traced_batch_dims(self, x, d=0):
        """(for netcl.trace) where output, h_n and c_n hold the dimension x holds at d (the traced batch):
        the output where x does (it keeps x's layout); h_n and c_n second when that dimension is the
        batch (d 0 with batch_first, 1 without), else nowhere (it is the time)."""
        batch = 1 if x.ndim == 3 and d == (0 if self.batch_first else 1) else None
        return (d, batch, batch)

    @property
    def num_directions(self):
        return 2 if self.bidirectional else 1

    @classmethod
    def tensor_shapes(cls, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                      bidirectional=False, proj_size=0):
        out, gh = {}, cls.GATES * hidden_size
        for layer in range(num_layers):
            for sfx in ("", "_reverse")[:2 if bidirectional else 1]:
                fan_in = input_size if layer == 0 else hidden_size * (2 if bidirectional else 1)
                out[f"weight_ih_l{layer}{sfx}"] = (gh, fan_in)
                out[f"weight_hh_l{layer}{sfx}"] = (gh, hidden_size)
                if bias:
                    out[f"bias_ih_l{layer}{sfx}"] = (gh,)
                    out[f"bias_hh_l{layer}{sfx}"] = (gh,)
        return out

    def config(self):
        return {"input_size": self.input_size, "hidden_size": self.hidden_size, "num_layers": self.num_layers,
                "bias": self.bias, "batch_first": self.batch_first, "dropout": self.dropout,
                "bidirectional": self.bidirectional}

    def _weights(self, layer, d):
        sfx = f"l{layer}" + ("_reverse" if d else "")
        return (getattr(self, f"weight_ih_{sfx}"), getattr(self, f"weight_hh_{sfx}"),
                getattr(self, f"bias_ih_{sfx}", None), getattr(self, f"bias_hh_{sfx}", None))

    def output_shape(self, shape):
        """The shape of the output sequence (the first of forward's results)."""
        shape = tuple(shape)
        if len(shape) not in (2, 3) or shape[-1] != self.input_size:
            raise ValueError(f"{type(self).__name__}: expected input of shape (L, N, {self.input_size}) "
                             f"(or (N, L, {self.input_size}) with batch_first, or unbatched (L, "
                             f"{self.input_size})), got {shape}")
        return shape[:-1] + (self.num_directions * self.hidden_size,)

    def state_shape(self, shape):
        """(num_layers * num_directions, N, hidden_size) for input `shape` (without N when unbatched)."""
        self.output_shape(shape)
        n = () if len(shape) == 2 else (shape[0] if self.batch_first else shape[1],)
        return (self.num_layers * self.num_directions,) + n + (self.hidden_size,)

    def macs(self, shape):
        out = self.output_shape(shape)
        steps = math.prod(out[:-1])  # (time steps * batch)
        total, fan_in = 0, self.input_size
        for _ in range(self.num_layers):
            total += steps * self.num_directions * self.GATES * self.hidden_size * (fan_in + self.hidden_size)
            fan_in = self.num_directions * self.hidden_size
        return total

    # -- calls ---------------------------------------------------------------------------------
    def _states(self, hx):
        """(h_0, c_0) from forward's hx (None, a tensor, or LSTM's pair)."""
        if self.GATES == 4:
            if hx is None:
                return None, None
            if not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                raise TypeError("LSTM: hx must be a tuple (h_0, c_0) of tensors, or None")
            return hx[0], hx[1]
        if isinstance(hx, (tuple, list)):
            raise TypeError("GRU: hx must be a tensor h_0, or None")
        return hx, None

    def __call__(self, x, hx=None):
        mode = autograd.MODE
        if mode.tracer is not None and not mode.tracer.busy and not mode.inside:
            return mode.tracer.call(self, (x,) if hx is None else (x, hx), {})
        h0, c0 = self._states(hx)
        if isinstance(x, Tensor):
            self.__dict__["_input_shape"] = x.shape
        if autograd.needs_record(x, h0, c0) or (autograd.recording() and self._wants_grads()):
            node = RNNCall(self, x, h0, c0)
            outs = autograd.attach(node, node.outputs)
            node.outputs = None
            return self._pack(outs[0], outs[1], outs[2] if len(outs) == 3 else None)
        y, hn, cn, _ = self._run(x, h0, c0, keep=False)
        return self._pack(y, hn, cn)

    def forward(self, x, hx=None):
        """(output, (h_n, c_n)) for LSTM, (output, h_n) for GRU."""
        h0, c0 = self._states(hx)
        y, hn, cn, _ = self._run(x, h0, c0, keep=False)
        return self._pack(y, hn, cn)

    def _pack(self, y, hn, cn):
        return (y, (hn, cn)) if self.GATES == 4 else (y, hn)

    def backward(self, dy):
        raise NotImplementedError(f"{type(self).__name__} returns several tensors: autograd differentiates its calls "
                                  "(loss.backward()), not a backward(dy) of the layer alone")

    def _check_state(self, t, name, want, q):
        if t is None:
            return None
        if not isinstance(t, Tensor):
            raise TypeError(f"{type(self).__name__}: {name} must be a netcl Tensor, got {type(t).__name__}")
        if t.shape != want:
            raise ValueError(f"{type(self).__name__}: expected {name} of shape {want}, got {t.shape}")
        return t.to(q) if t.queue is None else t

    def _run(self, x, h0, c0, keep):
        """The forward: (y, h_n, c_n (None for GRU), what backward needs (when keep))."""
        if not isinstance(x, Tensor):
            raise TypeError(f"{type(self).__name__} expects a netcl Tensor, got {type(x).__name__}")
        q = self._on(x)
        out_shape, state_shape = self.output_shape(x.shape), self.state_shape(x.shape)
        h0 = self._check_state(h0, "h_0" if self.GATES == 3 else "hx[0] (h_0)", state_shape, q)
        c0 = self._check_state(c0, "hx[1] (c_0)", state_shape, q)
        unbatched = x.ndim == 2
        T, B = (x.shape[0], 1) if unbatched else ((x.shape[1], x.shape[0]) if self.batch_first else x.shape[:2])
        if T == 0 or B == 0:
            raise ValueError(f"{type(self).__name__}: expected a sequence of at least one step and a batch of at least "
                             f"one, got input of shape {x.shape}")
        H, D, G, L = self.hidden_size, self.num_directions, self.GATES * self.hidden_size, self.num_layers
        lstm = self.GATES == 4
        vw, items = _lanes(q, H, B)
        inp = _time_major(x, T, B, self.batch_first and not unbatched)
        h0 = h0 if h0 is not None else Tensor.zeros(q, (L * D, B, H))
        if lstm:
            c0 = c0 if c0 is not None else Tensor.zeros(q, (L * D, B, H))
        hn, cn = ops.new(q, (L * D, B, H)), (ops.new(q, (L * D, B, H)) if lstm else None)
        layers, drop = [], self.training and self.dropout > 0.0
        for layer in range(L):
            mask = None
            if layer and drop:
                mask, dropped = ops.new(q, inp.shape), ops.new(q, inp.shape)
                ops.launch1d(q, "pointwise", "dropout_fwd", inp.size, inp.size, _seed(), self.dropout, inp, mask,
                             dropped)
                ops.varies((1,), lambda: (_seed(),))  # a replayed step draws its seed as this call did
                inp = dropped
            y = ops.new(q, (T, B, D * H))
            dirs = []
            for d in range(D):
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, d)
                gx = ops.matmul(inp.reshape(T * B, inp.shape[2]), w_ih, trans_b=True, bias=b_ih,
                                bias_mode=1 if b_ih is not None else 0)
                # (a call backward will not differentiate keeps no step's gates: c is updated in place)
                hp, sv = (ops.new(q, (T, B, H)), ops.new(q, (T, B, 4 * H))) if keep else (ops.dummy(q),) * 2
                cs = ops.new(q, (T, B, H) if keep else (B, H)) if lstm else None
                tk = (lambda t: t) if keep else (lambda t: 0)  # where step t's c (LSTM), gates and h_{t-1} go
                gh = ops.new(q, (B, G))
                bh = b_hh if b_hh is not None else ops.dummy(q)
                s0 = (layer * D + d) * B * H  # this layer and direction's rows of h_0, c_0, h_n, c_n
                for s in range(T):
                    t, prev = _step(s, d, T)
                    h, h_off, hs = (h0, s0, H) if s == 0 else (y, prev * B * D * H + d * H, D * H)
                    # gh = h_{t-1} @ W_hh^T: W_hh (G, H) read as (H, G) by its strides
                    ops.gemm(B, G, H, h, (hs, 1, 0), w_hh, (1, H, 0), gh, (G, 1, 0), offsets=(h_off, 0, 0))
                    common = (B, H, int(b_hh is not None), gx, t * B * G, gh, bh, h, h_off, hs)
                    if lstm:
                        cp, cp_off = (c0, s0) if s == 0 else (cs, tk(prev) * B * H)
                        ops.launch1d(q, "rnn", "lstm_fwd", items, *common, cp, cp_off, y, t * B * D * H + d * H,
                                     D * H, hp, cs, sv, tk(t), int(keep), options=vw)
                    else:
                        ops.launch1d(q, "rnn", "gru_fwd", items, *common, y, t * B * D * H + d * H, D * H, hp, sv,
                                     tk(t), int(keep), options=vw)
                last = _step(T - 1, d, T)[0]
                array_ops.copy_strided(y, (B, H), (D * H, 1), last * B * D * H + d * H, hn, (H, 1), s0)
                if lstm:
                    array_ops.copy_strided(cs, (B, H), (H, 1), tk(last) * B * H, cn, (H, 1), s0)
                dirs.append((hp, cs, sv))
            layers.append((inp, mask, dirs))
            inp = y.mark_written()
        hn.mark_written()
        if lstm:
            cn.mark_written()
        y = _from_time_major(inp, out_shape, T, B, self.batch_first and not unbatched)
        if unbatched:
            hn, cn = hn.reshape(L * D, H), (cn.reshape(L * D, H) if lstm else None)
        ctx = _Ctx(T=T, B=B, unbatched=unbatched, h0=h0, c0=c0, layers=layers, x_shape=x.shape) if keep else None
        return y, hn, cn, ctx

    def _grad(self, ctx, dy, dhn, dcn, want_x):
        """The backward of a call: (dx, dh_0, dc_0); the parameters' gradients go to their .grad."""
        T, B, H, D, G, L = ctx.T, ctx.B, self.hidden_size, self.num_directions, self.GATES * self.hidden_size, \
            self.num_layers
        lstm = self.GATES == 4
        q = ctx.h0.queue
        vw, items = _lanes(q, H, B)
        bf = self.batch_first and not ctx.unbatched
        dy = _time_major(dy, T, B, bf) if dy is not None else Tensor.zeros(q, (T, B, D * H))
        dhn = dhn.reshape(L * D, B, H) if dhn is not None else Tensor.zeros(q, (L * D, B, H))
        dcn = dcn.reshape(L * D, B, H) if dcn is not None else (Tensor.zeros(q, (L * D, B, H)) if lstm else None)
        dh0 = ops.new(q, (L * D, B, H))
        dc0 = ops.new(q, (L * D, B, H)) if lstm else None
        for layer in reversed(range(L)):
            inp, mask, dirs = ctx.layers[layer]
            fan_in = inp.shape[2]
            need_dinp = layer > 0 or want_x
            dinp = ops.new(q, (T, B, fan_in)) if need_dinp else None
            for d in range(D):
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, d)
                hp, cs, sv = dirs[d]
                s0 = (layer * D + d) * B * H
                carry = ops.new(q, (B, H))
                if lstm:
                    array_ops.copy_strided(dcn, (B, H), (H, 1), s0, carry, (H, 1), 0)
                dgi = ops.new(q, (T, B, G))
                dgh = dgi if lstm else ops.new(q, (T, B, G))
                dhr = ops.new(q, (B, H))
                for s in reversed(range(T)):
                    t, prev = _step(s, d, T)
                    if s + 1 < T:  # dh_t from the step after: dg_{t+1} @ W_hh
                        nxt = _step(s + 1, d, T)[0]
                        ops.gemm(B, H, G, dgh, (G, 1, 0), w_hh, (H, 1, 0), dhr, (H, 1, 0), offsets=(nxt * B * G, 0, 0))
                    common = (B, H, int(s + 1 < T), dy, t * B * D * H + d * H, D * H, dhr, dhn, s0)
                    if lstm:
                        cp, cp_off = (ctx.c0, s0) if s == 0 else (cs, prev * B * H)
                        ops.launch1d(q, "rnn", "lstm_bwd", items, *common, cs, cp, cp_off, sv, dgi, carry, t,
                                     options=vw)
                    else:
                        ops.launch1d(q, "rnn", "gru_bwd", items, *common, hp, sv, dgi, dgh, carry, t, options=vw)
                first = _step(0, d, T)[0]
                # dh_0 = dg(first step) @ W_hh (+ GRU's direct share z * dh, left in carry)
                if lstm:
                    array_ops.copy_strided(carry, (B, H), (H, 1), 0, dc0, (H, 1), s0)
                else:
                    array_ops.copy_strided(carry, (B, H), (H, 1), 0, dh0, (H, 1), s0)
                ops.gemm(B, H, G, dgh, (G, 1, 0), w_hh, (H, 1, 0), dh0, (H, 1, 0), beta=0.0 if lstm else 1.0,
                         offsets=(first * B * G, 0, s0))
                dgi2, dgh2 = dgi.reshape(T * B, G), dgh.reshape(T * B, G)
                _param_grad(w_ih, lambda gw, acc: ops.matmul(dgi2, inp.reshape(T * B, fan_in), trans_a=True,
                                                             out=gw, beta=acc))
                _param_grad(w_hh, lambda gw, acc: ops.matmul(dgh2, hp.reshape(T * B, H), trans_a=True, out=gw,
                                                             beta=acc))
                for b, g2 in ((b_ih, dgi2), (b_hh, dgh2)):
                    if b is not None:
                        _param_grad(b, lambda gb, acc: ops.sum_axis(g2, T * B, G, G, 1, gb, accumulate=bool(acc)))
                if need_dinp:
                    ops.matmul(dgi2, w_ih, out=dinp.reshape(T * B, fan_in), beta=float(d > 0))
            if dinp is not None:
                dinp.mark_written()
                if mask is not None:
                    dinp = ops.mul(dinp, mask)
            dy = dinp
        dh0.mark_written()
        if lstm:
            dc0.mark_written()
        dx = None
        if want_x:
            dx = _from_time_major(dy, ctx.x_shape, T, B, bf)
        if ctx.unbatched:
            dh0, dc0 = dh0.reshape(L * D, H), (dc0.reshape(L * D, H) if lstm else None)
        return dx, dh0, dc0


def _lanes(q, H, B):
    """rnn.cl's build options (the hidden units a work-item takes, VW) and its work-items per step: on
    CPUs the widest of 16, 8, 4 that divides H and the device's lanes, on GPUs 1."""
    vw = 1
    if ops.config_class(q) != "gpu":
        vw = next((w for w in (16, 8, 4) if H % w == 0 and w <= ops.float_lanes(q)), 1)
    return (f"-DVW={vw}",), B * H // vw


def _step(s, d, T):
    """(the time of step s in direction d, the time of the step before it)."""
    return (s, s - 1) if d == 0 else (T - 1 - s, T - s)


def _param_grad(p, fn):
    g, acc = ops.grad_target(p)
    fn(g, float(acc))
    g.mark_written()


def _time_major(x, T, B, batch_first):
    """x as (T, B, F): a copy when batch first, else the same data."""
    F = x.shape[-1]
    if not batch_first:
        return x.reshape(T, B, F)
    out = ops.new(x, (T, B, F))
    array_ops.copy_strided(x, (T, B, F), (F, T * F, 1), 0, out, (B * F, F, 1), 0)
    return out


def _from_time_major(y, shape, T, B, batch_first):
    """y (T, B, F) in the caller's layout `shape`."""
    if not batch_first:
        return y.reshape(shape)
    F = y.shape[-1]
    out = ops.new(y, (B, T, F))
    array_ops.copy_strided(y, (B, T, F), (F, B * F, 1), 0, out, (T * F, F, 1), 0)
    return out


class RNNCall(autograd.Node):
    """A call of an LSTM or GRU: inputs x, h_0, c_0 (c_0 LSTM's only); outputs y, h_n, c_n."""

    def __init__(self, layer, x, h0, c0):
        super().__init__((x, h0, c0))
        self.layer = layer
        with autograd.inside_layer:
            y, hn, cn, self.ctx = layer._run(x, h0, c0, keep=True)
        self.n_out = 3 if cn is not None else 2
        self.outputs = (y, hn, cn) if cn is not None else (y, hn)
        self.save(x, *(t for t in (h0, c0) if t is not None), *layer.parameters())

    @property
    def name(self):
        """The node's name in messages and reprs."""
        return f"{type(self.layer).__name__} (a layer call)"

    def backward(self, dy, dhn, dcn=None):
        self.saved_tensors()  # the inputs and the parameters as the forward saw them
        dx, dh0, dc0 = self.layer._grad(self.ctx, dy, dhn, dcn, self.inputs[0] is not None)
        return dx, dh0, dc0

    def release(self):
        super().release()
        self.ctx = None


class LSTM(_RNNBase):
    """LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, proj_size=0), as torch.nn.LSTM: input (L, N, input_size) ((N, L, input_size) with
    batch_first, or unbatched (L, input_size)); forward(x, hx=None) returns (output, (h_n, c_n)), output
    (L, N, D * hidden_size), h_n and c_n (num_layers * D, N, hidden_size), D = 2 if bidirectional. Gates
    i, f, g, o in PyTorch's order and layout; dropout between layers in training; proj_size must be 0."""
    GATES = 4


class GRU(_RNNBase):
    """GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False), as torch.nn.GRU: forward(x, hx=None) returns (output, h_n), shapes as LSTM's.
    Gates r, z, n in PyTorch's order and layout, n = tanh(W_in x + b_in + r * (W_hn h + b_hn))."""
    GATES = 3

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False):
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional)
