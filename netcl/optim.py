"""Optimizers with torch.optim's update rules; updates run on the device.

`state_dict()` returns plain arrays and numbers (checkpoints store it without pickle)."""
import numpy as np

from netcl import ops
from netcl.nn.module import as_bool, as_float
from netcl.tensor import Tensor


class Optimizer:
    slots = ()  # names of per-parameter state tensors

    def __init__(self, params, lr):
        self.params = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        for p in self.params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer parameters must be netcl Tensors, got {type(p).__name__}")
        self.lr = as_float("lr", lr, 0.0)
        self.state = [dict() for _ in self.params]  # per parameter: slot -> Tensor, "step" -> int

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def _slot(self, i, name):
        """Per-parameter state tensor `name`, created as zeros, on the parameter's device."""
        st, p = self.state[i], self.params[i]
        if name not in st:
            st[name] = Tensor.zeros(p.queue, p.shape)
        t = st[name]
        if t.queue is None or t.queue.context != p.queue.context:
            t.to(p.queue)  # state loaded from a checkpoint lives on the host until the first step
        return t

    def step(self):
        for i, p in enumerate(self.params):
            if p.grad is not None:
                st = self.state[i]
                st["step"] = st.get("step", 0) + 1
                self._update(i, p, st)
                p.mark_written()

    # -- checkpoints ---------------------------------------------------------------------
    def hyperparameters(self):
        raise NotImplementedError

    def state_dict(self):
        """{"type", "hyper": {...}, "state": {"<i>.<slot>": array, "<i>.step": int}}"""
        state = {}
        for i, st in enumerate(self.state):
            for k, v in st.items():
                state[f"{i}.{k}"] = v.to_host() if isinstance(v, Tensor) else v
        return {"type": type(self).__name__, "hyper": self.hyperparameters(), "state": state}

    def load_state_dict(self, d):
        if d.get("type") != type(self).__name__:
            raise ValueError(f"optimizer state is for {d.get('type')!r}, not {type(self).__name__}")
        checked = type(self)(self.params, **d["hyper"])  # validates the hyperparameters
        for k in d["hyper"]:
            setattr(self, k, getattr(checked, k))
        self.state = [dict() for _ in self.params]
        for key, v in d["state"].items():
            i, name = key.split(".", 1)
            i = int(i)
            if not 0 <= i < len(self.params):
                raise ValueError(f"optimizer state names parameter {i}, the model has {len(self.params)}")
            p = self.params[i]
            if name == "step":
                self.state[i][name] = int(v)
            else:
                a = np.asarray(v, np.float32)
                if a.shape != p.shape:
                    raise ValueError(f"optimizer state {key!r} has shape {a.shape}, parameter has {p.shape}")
                self.state[i][name] = Tensor.from_host(p.queue, a)
        return self


class SGD(Optimizer):
    def __init__(self, params, lr=0.01, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(params, lr)
        self.momentum, self.dampening = as_float("momentum", momentum, 0.0), as_float("dampening", dampening, 0.0, 1.0)
        self.weight_decay, self.nesterov = as_float("weight_decay", weight_decay, 0.0), as_bool("nesterov", nesterov)
        if nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("Nesterov momentum requires momentum > 0 and zero dampening")

    def hyperparameters(self):
        return {"lr": self.lr, "momentum": self.momentum, "dampening": self.dampening,
                "weight_decay": self.weight_decay, "nesterov": self.nesterov}

    def _update(self, i, p, st):
        first = "momentum_buffer" not in st
        buf = self._slot(i, "momentum_buffer") if self.momentum else p.grad
        ops.launch1d(p.queue, "optim", "sgd_step", p.size, p.size, p, p.grad, buf, self.lr, self.momentum,
                     self.dampening, self.weight_decay, int(self.nesterov), int(first))
        if self.momentum:
            buf.mark_written()


class Adam(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"Adam betas must be a pair (beta1, beta2), got {betas!r}")
        b1, b2 = (as_float(f"betas[{i}]", b, 0.0, 1.0) for i, b in enumerate(betas))
        if b1 >= 1.0 or b2 >= 1.0:
            raise ValueError(f"Adam betas must be in [0, 1), got {betas}")
        self.betas, self.eps = (b1, b2), as_float("eps", eps, 0.0)
        self.weight_decay = as_float("weight_decay", weight_decay, 0.0)

    def hyperparameters(self):
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps, "weight_decay": self.weight_decay}

    def _update(self, i, p, st):
        m, v = self._slot(i, "exp_avg"), self._slot(i, "exp_avg_sq")
        b1, b2 = self.betas
        t = st["step"]
        ops.launch1d(p.queue, "optim", "adam_step", p.size, p.size, p, p.grad, m, v, self.lr, b1, b2, self.eps,
                     self.weight_decay, 1.0 - b1 ** t, 1.0 - b2 ** t)
        m.mark_written()
        v.mark_written()
