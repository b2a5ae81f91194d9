"""Ahead-of-time builds: compile_model(model, example_input) builds every kernel a model's calls on
inputs of that shape need (the fused inference path's, or with train=True a training step's), so
that the first real call compiles nothing: for container images (`netcl warmup MODEL.netcl` does
this from the command line and leaves the kernels in the kernel cache), and before timing.

The specialised kernels are built too (NETCL_COMPILE=eager for the duration: netcl.runtime.tiers),
and the model is left as it was: parameters, buffers (a BatchNorm's running statistics),
gradients, training mode and netcl's random generator are restored after the training step."""
import json
import os
import shutil
import sys
import time

import numpy as np

from netcl import nn, ops, optim
from netcl.io.netcl_format import load
from netcl.nn import module as _module
from netcl.runtime import collecting, default_queue, kernels, program, tiers
from netcl.tensor import Tensor
from netcl.trainstep import TrainStep


def compile_model(model, example_input, train=False, loss_fn=None, optimizer=None, queue=None):
    """Build what `model` runs on inputs shaped like `example_input` (an array or a device Tensor;
    the batch size counts: a few launch sizes are per batch): predict()'s fused plan, or with
    `train` a training step's forward and backward, and with `loss_fn` and `optimizer` (of the kinds
    the training uses; the optimizer itself is not stepped) a TrainStep's whole step: loss, fused
    classifier head, update. Returns {"programs": programs compiled, "seconds": wall seconds}."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"compile_model takes a netcl nn.Module, got {type(model).__name__}")
    if (loss_fn is None) != (optimizer is None):
        raise ValueError("compile_model builds a TrainStep's kernels with both loss_fn and optimizer, or neither")
    if isinstance(example_input, Tensor):
        queue = example_input.queue if example_input.on_device else queue
        x = example_input.to_host()
    else:
        x = np.asarray(example_input, np.float32)
    q = queue or default_queue()
    out_shape = model.output_shape(x.shape)  # a shape the model does not take: its ValueError, here
    t, before, was_training = time.perf_counter(), program.stats["compiled"], model.training
    with tiers.with_mode("eager"):
        if train:
            _train_once(model, q, x, out_shape, loss_fn, optimizer)
            _build_routes(model, q)
        else:
            model.eval()
            try:
                if hasattr(model, "predict"):  # (predict() picks its own queue unless given one: PoCL's
                    model.predict(x, queue)  # serial device for small calls, as the real call will)
                else:
                    model(Tensor.from_host(q, x))
            finally:
                model.train(was_training)
    q.finish()
    return {"programs": program.stats["compiled"] - before, "seconds": time.perf_counter() - t}


def _train_once(model, q, x, out_shape, loss_fn, optimizer):
    """One training step on the example, everything it changes put back afterwards."""
    model.to(q)
    tensors = [(t, t.to_host()) for _, t in model.named_tensors()]
    grads = [(p, p.grad, None if p.grad is None else p.grad.to_host()) for p in model.parameters()]
    state, was_training = _module.rng().bit_generator.state, model.training
    model.train()
    try:
        if loss_fn is not None:
            opt = type(optimizer)(model.parameters(), **optimizer.hyperparameters())
            step = TrainStep(model, loss_fn, opt, replay=False)
            float(step(x, _target(loss_fn, out_shape)))
        else:
            y = model(Tensor.from_host(q, x))
            dy = np.random.default_rng(0).standard_normal(y.shape).astype(np.float32)
            model.backward(Tensor.from_host(q, dy), input_grad=False)
    finally:
        for t, values in tensors:
            t.set_(values)
        for p, grad, values in grads:
            p.grad = grad
            if grad is not None:
                grad.set_(values)
        _module.rng().bit_generator.state = state
        model.train(was_training)


def _build_routes(module, q):
    """Every specialised kernel the training routes chosen so far may launch (Conv2d.route_kernels),
    whether or not this step did (a pooled weight gradient stood in for one), so that a later
    process's routes find them ready."""
    for family, name, options in getattr(module, "route_kernels", lambda: ())():
        kernels(q, family, options)[name]
    for _, child in module.named_children():
        _build_routes(child, q)


def _target(loss_fn, out_shape):
    """A target the loss takes for an output of `out_shape`: class 0 everywhere, or zeros."""
    if isinstance(loss_fn, nn.CrossEntropyLoss):
        return np.zeros((out_shape[0],) + tuple(out_shape[2:]), np.int64)
    return np.zeros(out_shape, np.float32)


def _helper(folder):
    """`python -m netcl.warmup --helper FOLDER` (netcl.buildhelper): a training step of the model and
    spec in FOLDER, walked dry (nothing built, nothing launched) for the kernels it runs, which are
    then built last to first (the first call builds first to last: they meet in the middle), each
    unless another process builds it now; then, at a lower priority, the background thread's
    kernels, and those the walk finds once the full routes run (a fusion only they allow)."""
    with open(os.path.join(folder, "spec.json")) as f:
        spec = json.load(f)
    model = load(os.path.join(folder, "model.netcl"))
    shutil.rmtree(folder, ignore_errors=True)
    program.dry = True
    ops._enqueue = lambda *args: None  # nothing launched: only the kernels' builds count
    q = default_queue()
    loss_fn = getattr(nn, spec["loss"])()
    target = np.zeros(spec["target"], np.int64 if isinstance(loss_fn, nn.CrossEntropyLoss) else np.float32)
    optimizer = getattr(optim, spec["optimizer"])(model.to(q).train().parameters(), **spec["hyper"])
    step = TrainStep(model, loss_fn, optimizer, replay=False)
    for walk in range(3):  # again once the specialised kernels are built: the full routes' own kernels
        with collecting([]) as found:
            step(np.zeros(spec["x"], np.float32), target)
        todo = [k for k in dict.fromkeys(found) if not kernels(q, k[0], k[2]).ready(k[1])]
        if not todo and walk:
            break
        for family, name, options in reversed(todo):
            kernels(q, family, options)[name]  # (None where another process builds it: skipped)
        if walk == 0:
            os.nice(10)
        tiers.settle()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--helper"] and len(sys.argv) == 3:
        _helper(sys.argv[2])
    else:
        sys.exit("usage: python -m netcl.warmup --helper FOLDER (netcl.buildhelper starts it)")

