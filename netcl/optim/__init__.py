"""Optimizers with torch.optim's names, arguments and update rules; updates run on the device
(netcl/kernels/optim.cl), one launch per parameter group and step (see netcl.optim.optimizer).
`lr_scheduler` holds torch's learning-rate schedules."""
from netcl import ops
from netcl.nn.module import as_bool, as_float
from netcl.optim.optimizer import Optimizer, _setting, update
from netcl.optim import lr_scheduler  # noqa: F401  (optim.lr_scheduler, as torch's)


def _betas(betas):
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    b1, b2 = (as_float(f"betas[{i}]", b, 0.0, 1.0) for i, b in enumerate(betas))
    if b1 >= 1.0 or b2 >= 1.0:
        raise ValueError(f"betas must be in [0, 1), got {tuple(betas)}")
    return b1, b2


class SGD(Optimizer):
    """SGD(params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False): torch.optim.SGD's
    update on the device."""
    slot_names = ("momentum_buffer",)
    zero_new_slots = False
    momentum, dampening, weight_decay, nesterov = (_setting(k) for k in ("momentum", "dampening", "weight_decay",
                                                                         "nesterov"))

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov))

    def _check_group(self, g):
        super()._check_group(g)
        g["momentum"] = as_float("momentum", g["momentum"], 0.0)
        g["dampening"] = as_float("dampening", g["dampening"], 0.0, 1.0)
        g["weight_decay"] = as_float("weight_decay", g["weight_decay"], 0.0)
        g["nesterov"] = as_bool("nesterov", g["nesterov"])
        if g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0):
            raise ValueError("Nesterov momentum requires momentum > 0 and zero dampening")
        return g

    def _group_slots(self, group):
        return self.slot_names if group["momentum"] else ()

    def _flags(self, group):
        return bool(group["momentum"]), group["nesterov"]

    def _key(self, group, st):
        return bool(group["momentum"]) and "momentum_buffer" not in st  # the first update copies the gradient

    def _launch(self, flat, off, n, first, g, i):
        buf = flat.slot["momentum_buffer"] if g["momentum"] else flat.grad
        update(flat.q, "sgd_step", n, off, n, flat.param, flat.grad, buf, g["lr"], g["momentum"], g["dampening"],
               g["weight_decay"], int(g["nesterov"]), int(first))
        ops.varies((5, 6, 7, 8), lambda: (g["lr"], g["momentum"], g["dampening"], g["weight_decay"]))


class Adam(Optimizer):
    """Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False):
    torch.optim.Adam's update on the device (weight decay as an L2 term of the gradient)."""
    slot_names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    decoupled = False  # AdamW: the weight decay scales the parameter instead
    betas, eps, weight_decay, amsgrad = (_setting(k) for k in ("betas", "eps", "weight_decay", "amsgrad"))

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad))

    def _check_group(self, g):
        super()._check_group(g)
        g["betas"] = _betas(g["betas"])
        g["eps"] = as_float("eps", g["eps"], 0.0)
        g["weight_decay"] = as_float("weight_decay", g["weight_decay"], 0.0)
        g["amsgrad"] = as_bool("amsgrad", g["amsgrad"])
        return g

    def _group_slots(self, group):
        return self.slot_names if group["amsgrad"] else self.slot_names[:2]

    def _flags(self, group):
        return (group["amsgrad"],)

    def _key(self, group, st):
        return st["step"]  # the bias corrections

    @staticmethod
    def _corrections(g, t):
        b1, b2 = g["betas"]
        return 1.0 - b1 ** t, 1.0 - b2 ** t

    def _launch(self, flat, off, n, t, g, i):
        """Parameters from i on (flat offset off, n values) of group g at step t."""
        m, v = flat.slot["exp_avg"], flat.slot["exp_avg_sq"]
        vmax = flat.slot["max_exp_avg_sq"] if g["amsgrad"] else v
        update(flat.q, "adam_step", n, off, n, flat.param, flat.grad, m, v, vmax, g["lr"], *g["betas"], g["eps"],
               g["weight_decay"], *self._corrections(g, t), int(self.decoupled), int(g["amsgrad"]))
        st = self.state[i]
        ops.varies((7, 8, 9, 10, 11, 12, 13),  # a replay's settings, and its step count's corrections
                   lambda: (g["lr"], *g["betas"], g["eps"], g["weight_decay"], *self._corrections(g, st["step"])))


class AdamW(Adam):
    """AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False):
    torch.optim.AdamW's update on the device (the parameter scaled by 1 - lr * weight_decay)."""
    decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad)


class RMSprop(Optimizer):
    """RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False):
    torch.optim.RMSprop's update on the device."""
    slot_names = ("square_avg", "momentum_buffer", "grad_avg")
    alpha, eps, weight_decay, momentum, centered = (_setting(k) for k in ("alpha", "eps", "weight_decay", "momentum",
                                                                          "centered"))

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered))

    def _check_group(self, g):
        super()._check_group(g)
        g["alpha"] = as_float("alpha", g["alpha"], 0.0)
        g["eps"] = as_float("eps", g["eps"], 0.0)
        g["weight_decay"] = as_float("weight_decay", g["weight_decay"], 0.0)
        g["momentum"] = as_float("momentum", g["momentum"], 0.0)
        g["centered"] = as_bool("centered", g["centered"])
        return g

    def _group_slots(self, group):
        return ("square_avg",) + (("momentum_buffer",) if group["momentum"] > 0 else ()) + (
            ("grad_avg",) if group["centered"] else ())

    def _flags(self, group):
        return group["momentum"] > 0, group["centered"]

    def _launch(self, flat, off, n, key, g, i):
        sq = flat.slot["square_avg"]
        buf = flat.slot["momentum_buffer"] if g["momentum"] > 0 else sq
        avg = flat.slot["grad_avg"] if g["centered"] else sq
        update(flat.q, "rmsprop_step", n, off, n, flat.param, flat.grad, sq, buf, avg, g["lr"], g["alpha"], g["eps"],
               g["weight_decay"], g["momentum"], int(g["momentum"] > 0), int(g["centered"]))
        ops.varies((8, 9, 10, 11, 12), lambda: (g["lr"], g["alpha"], g["eps"], g["weight_decay"], g["momentum"]))


__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "lr_scheduler"]
