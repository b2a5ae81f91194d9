"""Learning-rate schedules with torch.optim.lr_scheduler's names, arguments and arithmetic: each sets
its optimizer's `param_groups[i]["lr"]` (the same floats as torch's, step for step) when it steps.

    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
    for epoch in range(90):
        train_one_epoch(...)             # opt.step() per batch
        sched.step()                     # ReduceLROnPlateau: sched.step(validation_loss)

The optimizer's update kernels take each group's settings as arguments that netcl.TrainStep reads
anew for every replay, so a schedule never makes a recorded step record again.

`state_dict()`/`load_state_dict()` as torch's (every attribute but the optimizer); `config()` is the
constructor's arguments, from which a checkpoint rebuilds the scheduler (netcl.io.load_checkpoint)."""
import math
import numbers
import types
import warnings
from bisect import bisect_right

from netcl.optim.optimizer import Optimizer

_EPOCH_DEPRECATED = ("the epoch argument of scheduler.step() is deprecated, as in torch: call step() without it "
                     "(with it, the closed form is used where there is one)")


def _number(name, v, low=-math.inf, high=math.inf, integer=False):
    """An int (integer=True) or real argument in [low, high], or a clear error."""
    kinds = numbers.Integral if integer else numbers.Real
    if isinstance(v, bool) or not isinstance(v, kinds):
        raise TypeError(f"{name} must be {'an int' if integer else 'a number'}, got {type(v).__name__} {v!r:.50}")
    if not (low <= v <= high):
        raise ValueError(f"{name} must be in [{low}, {high}], got {v}")
    return int(v) if integer else float(v)


def _per_group(name, optimizer, value):
    """value for each group: a list or tuple of one per group, or one value for all (torch's _format_param)."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"{name} must have one value per parameter group: {name} has {len(value)}, "
                             f"param_groups has {len(optimizer.param_groups)}")
        return list(value)
    return [value] * len(optimizer.param_groups)


def _lrs(optimizer):
    return [g["lr"] for g in optimizer.param_groups]


class LRScheduler:
    """The base of the schedules (torch's LRScheduler): at construction it records each group's
    "initial_lr" (last_epoch=-1) and steps once; step() advances last_epoch and sets each group's
    lr to get_lr()."""

    def __init__(self, optimizer, last_epoch=-1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"a scheduler takes a netcl optimizer (optim.SGD, optim.Adam, ...), got "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        last_epoch = _number("last_epoch", last_epoch, -1, integer=True)
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] when resuming a "
                                   "scheduler with last_epoch >= 0 (load the optimizer's state first)")
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self):
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def config(self):
        """The constructor's keyword arguments (the optimizer aside): a checkpoint rebuilds the
        scheduler from them."""
        return dict(self._config)

    def state_dict(self):
        """Every attribute but the optimizer (torch's), as plain values."""
        return {k: _plain(v) for k, v in vars(self).items() if k not in ("optimizer", "_config")}

    def load_state_dict(self, state_dict):
        """Restore state_dict()'s attributes."""
        self.__dict__.update(state_dict)

    def get_last_lr(self):
        """The learning rate of each parameter group after the last step()."""
        return self._last_lr

    def get_lr(self):
        """The learning rates of the step being taken (step() calls it)."""
        raise NotImplementedError

    def step(self, epoch=None):
        """Advance the schedule one step (an epoch, or a batch for OneCycleLR) and set each group's lr."""
        self._step_count += 1
        if epoch is not None:
            warnings.warn(_EPOCH_DEPRECATED, UserWarning, stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch=None):
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            values = self._get_closed_form_lr() if hasattr(self, "_get_closed_form_lr") else self.get_lr()
        groups = self.optimizer.param_groups
        if len(values) != len(groups):
            raise RuntimeError(f"{type(self).__name__} has {len(values)} learning rates for {len(groups)} parameter "
                               "groups (a group was added after the scheduler was made)")
        for group, lr in zip(groups, values):
            group["lr"] = lr
        self._last_lr = _lrs(self.optimizer)


def _plain(v):
    return [_plain(e) for e in v] if isinstance(v, (list, tuple)) else {k: _plain(e) for k, e in v.items()} \
        if isinstance(v, dict) else v


class LambdaLR(LRScheduler):
    """LambdaLR(optimizer, lr_lambda, last_epoch=-1): lr = initial_lr * lr_lambda(epoch) (a function,
    or one per group). Not savable in a checkpoint (a function is not data)."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.optimizer = optimizer
        fns = list(_per_group("lr_lambda", optimizer, lr_lambda)) if isinstance(optimizer, Optimizer) else []
        if not all(callable(f) for f in fns):
            raise TypeError("lr_lambda must be a function of the epoch (or a list of one per parameter group)")
        self.lr_lambdas = fns
        self._config = {"lr_lambda": lr_lambda}
        super().__init__(optimizer, last_epoch)

    def state_dict(self):
        """As the base's, without the functions (torch keeps a callable object's attributes only)."""
        d = {k: _plain(v) for k, v in vars(self).items() if k not in ("optimizer", "_config", "lr_lambdas")}
        d["lr_lambdas"] = [None if isinstance(f, types.FunctionType) else dict(vars(f)) for f in self.lr_lambdas]
        return d

    def load_state_dict(self, state_dict):
        """As the base's; a callable object's saved attributes go back into it."""
        state = dict(state_dict)
        fns = state.pop("lr_lambdas", [None] * len(self.lr_lambdas))
        self.__dict__.update(state)
        for f, d in zip(self.lr_lambdas, fns):
            if d is not None:
                f.__dict__.update(d)

    def get_lr(self):
        """initial_lr * lr_lambda(last_epoch) per group."""
        return [base * f(self.last_epoch) for f, base in zip(self.lr_lambdas, self.base_lrs)]


class StepLR(LRScheduler):
    """StepLR(optimizer, step_size, gamma=0.1, last_epoch=-1): lr *= gamma every step_size epochs."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size = _number("step_size", step_size, 1, integer=True)
        self.gamma = _number("gamma", gamma)
        self._config = {"step_size": self.step_size, "gamma": self.gamma}
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        """The group's lr, times gamma at multiples of step_size."""
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return _lrs(self.optimizer)
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """MultiStepLR(optimizer, milestones, gamma=0.1, last_epoch=-1): lr *= gamma at each milestone
    epoch (gamma ** k where a milestone is given k times)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        if isinstance(milestones, (str, bytes)) or not hasattr(milestones, "__iter__"):
            raise TypeError(f"milestones must be a list of epochs, got {type(milestones).__name__}")
        self.milestones = sorted(_number("milestones[i]", m, 0, integer=True) for m in milestones)
        self.gamma = _number("gamma", gamma)
        self._config = {"milestones": list(self.milestones), "gamma": self.gamma}
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        """The group's lr, times gamma ** (times last_epoch is a milestone)."""
        if self.last_epoch not in self.milestones:
            return _lrs(self.optimizer)
        return [g["lr"] * self.gamma ** self.milestones.count(self.last_epoch) for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** bisect_right(self.milestones, self.last_epoch) for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """ConstantLR(optimizer, factor=1/3, total_iters=5, last_epoch=-1): lr * factor until total_iters."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        self.factor = _number("factor", factor, 0.0, 1.0)
        self.total_iters = _number("total_iters", total_iters, 0, integer=True)
        self._config = {"factor": self.factor, "total_iters": self.total_iters}
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        """factor times the lr at epoch 0, back to it at total_iters."""
        if self.last_epoch == 0:
            return [g["lr"] * self.factor for g in self.optimizer.param_groups]
        if self.last_epoch != self.total_iters:
            return _lrs(self.optimizer)
        return [g["lr"] * (1.0 / self.factor) for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor))
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """LinearLR(optimizer, start_factor=1/3, end_factor=1.0, total_iters=5, last_epoch=-1): the factor
    of the initial lr goes linearly from start_factor to end_factor over total_iters epochs."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        start_factor, end_factor = _number("start_factor", start_factor), _number("end_factor", end_factor)
        if not 0 < start_factor <= 1:
            raise ValueError(f"start_factor must be in (0, 1], got {start_factor}")
        if not 0 <= end_factor <= 1:
            raise ValueError(f"end_factor must be in [0, 1], got {end_factor}")
        self.start_factor, self.end_factor = start_factor, end_factor
        self.total_iters = _number("total_iters", total_iters, 1, integer=True)
        self._config = {"start_factor": start_factor, "end_factor": end_factor, "total_iters": self.total_iters}
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        """The group's lr times the ratio of this epoch's factor to the last's."""
        if self.last_epoch == 0:
            return [g["lr"] * self.start_factor for g in self.optimizer.param_groups]
        if self._is_initial or self.last_epoch > self.total_iters:
            return _lrs(self.optimizer)
        d = self.end_factor - self.start_factor
        return [g["lr"] * (1.0 + d / (self.total_iters * self.start_factor + (self.last_epoch - 1) * d))
                for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        d = self.end_factor - self.start_factor
        return [base * (self.start_factor + d * min(self.total_iters, self.last_epoch) / self.total_iters)
                for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """ExponentialLR(optimizer, gamma, last_epoch=-1): lr *= gamma every epoch."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = _number("gamma", gamma)
        self._config = {"gamma": self.gamma}
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        """The group's lr times gamma."""
        if self._is_initial:
            return _lrs(self.optimizer)
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """PolynomialLR(optimizer, total_iters=5, power=1.0, last_epoch=-1): the initial lr times
    (1 - epoch / total_iters) ** power, then 0."""

    def __init__(self, optimizer, total_iters=5, power=1.0, last_epoch=-1):
        self.total_iters = _number("total_iters", total_iters, 1, integer=True)
        self.power = _number("power", power)
        self._config = {"total_iters": self.total_iters, "power": self.power}
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        """The group's lr times the decay from the last epoch to this one."""
        if self._is_initial or self.last_epoch > self.total_iters:
            return _lrs(self.optimizer)
        decay = ((1.0 - self.last_epoch / self.total_iters) / (1.0 - (self.last_epoch - 1) / self.total_iters)) \
            ** self.power
        return [g["lr"] * decay for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ** self.power
                for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """CosineAnnealingLR(optimizer, T_max, eta_min=0.0, last_epoch=-1): the lr follows a cosine from
    the initial lr down to eta_min over T_max epochs (and back up, as torch's recursive form does)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max = _number("T_max", T_max, 1, integer=True)
        self.eta_min = _number("eta_min", eta_min)
        self._config = {"T_max": self.T_max, "eta_min": self.eta_min}
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        """torch's recursive form: from the group's current lr."""
        if self._is_initial:
            return _lrs(self.optimizer)
        if self._step_count == 1 and self.last_epoch > 0:
            return [self.eta_min + (base - self.eta_min) * (1 + math.cos(self.last_epoch * math.pi / self.T_max)) / 2
                    for base in self.base_lrs]
        if (self.last_epoch - 1 - self.T_max) % (2 * self.T_max) == 0:
            return [g["lr"] + (base - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2
                    for base, g in zip(self.base_lrs, self.optimizer.param_groups)]
        return [(1 + math.cos(math.pi * self.last_epoch / self.T_max))
                / (1 + math.cos(math.pi * (self.last_epoch - 1) / self.T_max)) * (g["lr"] - self.eta_min) + self.eta_min
                for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


class OneCycleLR(LRScheduler):
    """OneCycleLR(optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3,
    anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85, max_momentum=0.95, div_factor=25.0,
    final_div_factor=1e4, three_phase=False, last_epoch=-1): torch's 1cycle policy, stepped after
    every batch; it cycles the momentum (SGD, RMSprop) or beta1 (Adam, AdamW) the other way."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3,
                 anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85, max_momentum=0.95, div_factor=25.0,
                 final_div_factor=1e4, three_phase=False, last_epoch=-1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"a scheduler takes a netcl optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        if total_steps is not None:
            self.total_steps = _number("total_steps", total_steps, 1, integer=True)
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = _number("epochs", epochs, 1, integer=True) * _number(
                "steps_per_epoch", steps_per_epoch, 1, integer=True)
        else:
            raise ValueError("OneCycleLR needs total_steps, or epochs and steps_per_epoch")
        if isinstance(pct_start, bool) or not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ValueError(f"pct_start must be a float in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        div_factor, final_div_factor = _number("div_factor", div_factor), _number("final_div_factor", final_div_factor)
        n = self.total_steps
        phases = [(float(pct_start * n) - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                  (n - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]
        if three_phase:
            phases = [phases[0],
                      (float(2 * pct_start * n) - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
                      (n - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
        self._schedule_phases = [dict(zip(("end_step", "start_lr", "end_lr", "start_momentum", "end_momentum"), p))
                                 for p in phases]
        self._anneal_func_type = anneal_strategy
        max_lrs = [_number("max_lr", v, 0.0) for v in _per_group("max_lr", optimizer, max_lr)]
        last_epoch = _number("last_epoch", last_epoch, -1, integer=True)
        if last_epoch == -1:
            for lr, group in zip(max_lrs, optimizer.param_groups):
                group["initial_lr"] = lr / div_factor
                group["max_lr"] = lr
                group["min_lr"] = group["initial_lr"] / final_div_factor
        if not isinstance(cycle_momentum, bool):
            raise TypeError(f"cycle_momentum must be a bool, got {cycle_momentum!r:.50}")
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            maxes = [_number("max_momentum", v) for v in _per_group("max_momentum", optimizer, max_momentum)]
            bases = [_number("base_momentum", v) for v in _per_group("base_momentum", optimizer, base_momentum)]
            if last_epoch == -1:
                for top, bottom, group in zip(maxes, bases, optimizer.param_groups):
                    if self.use_beta1:
                        group["betas"] = (top, *group["betas"][1:])
                    else:
                        group["momentum"] = top
                    group["max_momentum"] = top
                    group["base_momentum"] = bottom
        self._config = {"max_lr": max_lr, "total_steps": total_steps, "epochs": epochs,
                        "steps_per_epoch": steps_per_epoch, "pct_start": pct_start, "anneal_strategy": anneal_strategy,
                        "cycle_momentum": cycle_momentum, "base_momentum": base_momentum,
                        "max_momentum": max_momentum, "div_factor": div_factor, "final_div_factor": final_div_factor,
                        "three_phase": three_phase}
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start, end, pct):
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        """The phase's annealed lr per group; sets the group's momentum (or beta1) alike."""
        lrs, step = [], self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"Tried to step {step} times. The specified number of total steps is {self.total_steps}")
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or i == len(self._schedule_phases) - 1:
                    pct = (step - start) / (end - start)
                    lr = self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    if self.cycle_momentum:
                        momentum = self._anneal(group[phase["start_momentum"]], group[phase["end_momentum"]], pct)
                    break
                start = phase["end_step"]
            lrs.append(lr)
            if self.cycle_momentum:
                if self.use_beta1:
                    group["betas"] = (momentum, *group["betas"][1:])
                else:
                    group["momentum"] = momentum
        return lrs


class SequentialLR(LRScheduler):
    """SequentialLR(optimizer, schedulers, milestones, last_epoch=-1): runs schedulers[0] until
    milestones[0], then schedulers[1] (from its start), and so on."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        schedulers, milestones = list(schedulers), [_number("milestones[i]", m, 0, integer=True) for m in milestones]
        if not schedulers:
            raise ValueError("SequentialLR expects at least one scheduler")
        for i, s in enumerate(schedulers):
            if not isinstance(s, LRScheduler):
                raise TypeError(f"SequentialLR: scheduler {i} is a {type(s).__name__}, not a netcl scheduler")
            if isinstance(s, ReduceLROnPlateau):
                raise ValueError("SequentialLR does not support ReduceLROnPlateau (its step needs the metric), "
                                 f"given at index {i}")
            if s.optimizer is not optimizer:
                raise ValueError(f"SequentialLR expects all schedulers to belong to its optimizer; scheduler {i} "
                                 f"({type(s).__name__}) has another")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR expects one milestone fewer than schedulers, got {len(schedulers)} "
                             f"schedulers and {len(milestones)} milestones")
        self._schedulers, self._milestones = schedulers, milestones
        self.last_epoch = _number("last_epoch", last_epoch, -1, integer=True) + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:  # undo what the schedulers' construction did
            group["lr"] = group["initial_lr"]
        self.recursive_undo()
        idx = bisect_right(self._milestones, 0)
        self._schedulers[idx]._initial_step()
        self._last_lr = schedulers[idx].get_last_lr()
        self._config = {"schedulers": schedulers, "milestones": list(milestones)}

    def recursive_undo(self, sched=None):
        """Take back the initial step of every scheduler it holds (torch's)."""
        scheds = self if sched is None else sched
        if hasattr(scheds, "_schedulers"):
            for s in scheds._schedulers:
                self.recursive_undo(s)
        elif hasattr(scheds, "last_epoch"):
            scheds.last_epoch -= 1

    def step(self):
        """Advance the scheduler of the current stretch (a milestone starts the next from its epoch 0)."""
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def config(self):
        """As the base's; each scheduler as {"type", "config"}."""
        return {"schedulers": [{"type": type(s).__name__, "config": s.config()} for s in self._schedulers],
                "milestones": list(self._milestones)}

    def state_dict(self):
        """As the base's; each scheduler's own state dict under "_schedulers"."""
        d = {k: _plain(v) for k, v in vars(self).items() if k not in ("optimizer", "_config", "_schedulers")}
        d["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return d

    def load_state_dict(self, state_dict):
        """As the base's; each scheduler loads its own."""
        state = dict(state_dict)
        schedulers = state.pop("_schedulers")
        self.__dict__.update(state)
        for s, d in zip(self._schedulers, schedulers):
            s.load_state_dict(d)


class ReduceLROnPlateau(LRScheduler):
    """ReduceLROnPlateau(optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4,
    threshold_mode="rel", cooldown=0, min_lr=0, eps=1e-8): step(metric) multiplies the lr by factor
    once the metric has not improved for more than `patience` steps (a metric Tensor is read)."""

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel",
                 cooldown=0, min_lr=0, eps=1e-8):
        self.factor = _number("factor", factor)
        if self.factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"a scheduler takes a netcl optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        if isinstance(min_lr, (list, tuple)):
            self.default_min_lr = None
            self.min_lrs = [_number("min_lr", v, 0.0) for v in _per_group("min_lr", optimizer, min_lr)]
        else:
            self.default_min_lr = _number("min_lr", min_lr, 0.0)
            self.min_lrs = [self.default_min_lr] * len(optimizer.param_groups)
        self.patience = _number("patience", patience, 0, integer=True)
        self.cooldown = _number("cooldown", cooldown, 0, integer=True)
        self.eps = _number("eps", eps, 0.0)
        self.last_epoch = 0
        self._last_lr = _lrs(optimizer)
        self._init_is_better(mode, _number("threshold", threshold), threshold_mode)
        self._reset()
        self._config = {"mode": mode, "factor": self.factor, "patience": self.patience, "threshold": self.threshold,
                        "threshold_mode": threshold_mode, "cooldown": self.cooldown, "min_lr": min_lr, "eps": self.eps}

    def _reset(self):
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def step(self, metrics, epoch=None):
        """One epoch's metric (a number or a 0-d Tensor, read): reduces the lr after a plateau."""
        current = float(metrics)
        if epoch is None:
            epoch = self.last_epoch + 1
        else:
            warnings.warn(_EPOCH_DEPRECATED, UserWarning, stacklevel=2)
        self.last_epoch = epoch
        if self._is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = _lrs(self.optimizer)

    def _reduce_lr(self):
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(f"the optimizer has {len(groups)} parameter groups, ReduceLROnPlateau was made "
                                   f"for {len(self.min_lrs)}: set its min_lrs to one per group")
            self.min_lrs = [self.default_min_lr] * len(groups)
        for i, group in enumerate(groups):
            old = float(group["lr"])
            new = max(old * self.factor, self.min_lrs[i])
            if old - new > self.eps:
                group["lr"] = new

    @property
    def in_cooldown(self):
        """Whether the scheduler is waiting out its cooldown after a reduction."""
        return self.cooldown_counter > 0

    def _is_better(self, a, best):
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min" and self.threshold_mode == "abs":
            return a < best - self.threshold
        if self.mode == "max" and self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    def _init_is_better(self, mode, threshold, threshold_mode):
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode

    def load_state_dict(self, state_dict):
        """As the base's, then the comparison set up again from mode and threshold."""
        self.__dict__.update(state_dict)
        self._init_is_better(self.mode, self.threshold, self.threshold_mode)


SCHEDULERS = {cls.__name__: cls for cls in (LambdaLR, StepLR, MultiStepLR, ConstantLR, LinearLR, ExponentialLR,
                                            PolynomialLR, CosineAnnealingLR, OneCycleLR, SequentialLR,
                                            ReduceLROnPlateau)}

__all__ = ["LRScheduler"] + list(SCHEDULERS)
