#!/usr/bin/env python3
"""Which torchvision models netcl takes, measured: each model with random weights (10 classes) goes
through nn.from_torch and through torch.onnx.export + netcl.io.import_onnx; each result is held
against torch's output on the same input (max difference relative to torch's largest output), and
the from_torch model trains five SGD steps on one batch (the loss must fall), beside torch's own
five steps from the same weights. Prints a Markdown table
(import_onnx's column names what it gave: a Sequential for a chain of layers, else a GraphModule).

    python tools/coverage_torchvision.py                       # every model, inputs 1x3x64x64
    python tools/coverage_torchvision.py --models resnet18,vit_b_16 --size 224
    python tools/coverage_torchvision.py --models vgg11_bn --size 224 --lr 0.001

Needs torch and torchvision (pip install torchvision). The first run of a model builds its kernels.
"""
import argparse
import copy
import os
import sys
import tempfile
import time
import warnings

import numpy as np

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "squeezenet1_1", "shufflenet_v2_x0_5",
          "efficientnet_b0", "vgg11_bn", "densenet121", "googlenet", "regnet_y_400mf", "convnext_tiny", "vit_b_16")


def torchvision_models():
    import torch

    try:
        import torchvision.models as tvm
    except RuntimeError:  # its compiled operators (nms) built for another torch: the models need none of them
        torch.library.register_fake = lambda *a, **k: (lambda f: f)
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        import torchvision.models as tvm
    return tvm


def build(tvm, name, size):
    import torch

    torch.manual_seed(0)
    kwargs = {"num_classes": 10}
    if name == "vit_b_16":
        kwargs["image_size"] = size
    if name == "googlenet":
        kwargs.update(aux_logits=False, init_weights=True)
    model = getattr(tvm, name)(**kwargs)
    with torch.no_grad():
        for p in model.parameters():  # (torchvision zeroes some heads: an all-zero output would agree with anything)
            if not p.any():
                p.normal_(0, 0.05)
        for m in model.modules():  # batch-norm statistics that a mix-up would show
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.8, 1.2)
    return model.eval()


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def from_torch_row(netcl, nn, q, tm, x, torch, lr):
    t0 = time.perf_counter()
    try:
        model = nn.from_torch(tm).to(q)
    except NotImplementedError as e:
        return f"refused: {str(e)[:90]}", "", ""
    with torch.no_grad():
        want = tm(torch.from_numpy(x)).numpy()
    with netcl.no_grad():
        got = model(netcl.tensor(x, queue=q)).numpy()
    err = rel(got, want)
    model.train()
    opt = netcl.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    xb = np.concatenate([x, x[:, :, ::-1].copy()])
    y = np.array([1, 7])
    losses, ref = [], []
    for _ in range(5):
        opt.zero_grad()
        loss = netcl.nn.functional.cross_entropy(model(netcl.tensor(xb, queue=q)), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    tm = copy.deepcopy(tm).train()  # torch's own five steps from the same weights (Dropout's masks differ)
    topt = torch.optim.SGD(tm.parameters(), lr=lr, momentum=0.9)
    for _ in range(5):
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(tm(torch.from_numpy(xb)), torch.from_numpy(y))
        tloss.backward()
        topt.step()
        ref.append(float(tloss))
    trains = (f"{losses[0]:.3f} -> {losses[-1]:.3f}" + ("" if losses[-1] < losses[0] else " (did not fall)")
              + f" (torch {ref[0]:.3f} -> {ref[-1]:.3f})")
    return f"yes ({time.perf_counter() - t0:.0f} s)", f"{err:.1e}", trains


def import_onnx_row(netcl, q, tm, x, torch, opset):
    from netcl.io import import_onnx

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.onnx")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(tm, (torch.from_numpy(x),), path, dynamo=False, opset_version=opset,
                                  input_names=["input"], output_names=["output"])
        except Exception as e:
            return f"torch.onnx.export failed: {type(e).__name__}", ""
        try:
            model = import_onnx(path)
        except NotImplementedError as e:
            return f"refused: {' '.join(str(e).split())[:90]}", ""  # (one table row)
    with torch.no_grad():
        want = tm(torch.from_numpy(x)).numpy()
    return f"yes ({type(model).__name__})", f"{rel(model.predict(x, q), want):.1e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated torchvision model names")
    ap.add_argument("--size", type=int, default=64, help="input height and width (default 64)")
    ap.add_argument("--lr", type=float, default=0.01,
                    help="the five SGD steps' learning rate (momentum 0.9; default 0.01: vgg11_bn diverges there, in torch too)")
    ap.add_argument("--opset", type=int, default=17, help="torch.onnx.export's opset (default 17)")
    args = ap.parse_args()
    import torch

    import netcl
    from netcl import nn

    tvm = torchvision_models()
    q = netcl.default_queue()
    x = np.random.default_rng(0).standard_normal((1, 3, args.size, args.size)).astype(np.float32)
    print(f"device: {q.device.name.strip()}; input 1x3x{args.size}x{args.size}; torch {torch.__version__}; "
          f"opset {args.opset}\n")
    print("| model | from_torch | max diff (rel.) | 5 SGD steps: loss | import_onnx | max diff (rel.) |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        tm = build(tvm, name, args.size)
        ft = from_torch_row(netcl, nn, q, tm, x, torch, args.lr)
        io = import_onnx_row(netcl, q, build(tvm, name, args.size), x, torch, args.opset)
        print(f"| {name} | {ft[0]} | {ft[1]} | {ft[2]} | {io[0]} | {io[1]} |", flush=True)


if __name__ == "__main__":
    main()
