#!/usr/bin/env python3
"""The main job, end to end, on the default OpenCL device (`make demo`):

1. trains a small CNN on scikit-learn's digits with a progress bar,
2. saves model.netcl and a training checkpoint,
3. exports model.onnx and runs the test set through netcl and onnxruntime
   (accuracies, identical predictions, max abs difference, latencies),
4. writes the training curve (PNG),
5. builds detector26, calibrates its batch norms on photographs shipped in scikit-learn,
   exports it and verifies it on those photographs at 256x256,
6. trains vit_tiny (a transformer: residual blocks, LayerNorm, attention, GELU) on the digits,
   saves it, exports it and verifies it on the test set.
Exits non-zero if any export disagrees with netcl.
"""
import argparse
import os
import sys
import time

import numpy as np

import netcl
from netcl import Tensor, models
from netcl.apps import common, recipes
from netcl.apps.common import median_time, ort_session
from netcl.io import export_onnx, load, load_checkpoint, save, save_checkpoint

ATOL, RTOL = 1e-4, 1e-3


def plot_history(history, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(history["epoch"], history["loss"], "o-", label="train loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross-entropy")
    ax2 = ax.twinx()
    ax2.plot(history["epoch"], history["train_acc"], "s--", color="tab:green", label="train accuracy")
    ax2.plot(history["epoch"], history["test_acc"], "s-", color="tab:red", label="test accuracy")
    ax2.set_ylabel("accuracy")
    ax2.set_ylim(0, 1.02)
    fig.legend(loc="center", bbox_to_anchor=(0.55, 0.45))
    ax.set_title("netcl: digits CNN")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out", help="output folder (default: out/)")
    ap.add_argument("--epochs", type=common.positive_int, default=12, help="training epochs (default 12)")
    ap.add_argument("--batch-size", type=common.positive_int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=common.positive_int, default=20, help="timed repetitions for latencies")
    ap.add_argument("--skip-detector", action="store_true", help="skip the detector26 part")
    ap.add_argument("--vit-epochs", type=common.positive_int, default=12,
                    help="vit_tiny training epochs (default 12; tools/train_reference.py trains 20)")
    ap.add_argument("--skip-vit", action="store_true", help="skip the vit_tiny part")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    p = lambda name: os.path.join(args.out, name)  # noqa: E731

    q = netcl.default_queue()
    print(f"device: {q.device.name.strip()} ({q.device.platform.name.strip()})")
    netcl.manual_seed(args.seed)
    data = recipes.digits_data(seed=args.seed)
    x_tr, y_tr, x_te, y_te = data
    print(f"digits: {len(x_tr)} training and {len(x_te)} test images of 8x8")

    # 1-2. train, save, checkpoint
    model = recipes.digits_cnn()
    t0 = time.perf_counter()
    opt, hist = recipes.train_classifier(model, q, data, epochs=args.epochs, batch_size=args.batch_size,
                                         lr=args.lr, seed=args.seed)
    train_s = time.perf_counter() - t0
    save(model, p("model.netcl"))
    save_checkpoint(p("checkpoint.netcl"), model, opt, epoch=args.epochs, recipe="digits")
    plot_history(hist, p("training_curve.png"))
    print(f"trained {args.epochs} epochs in {train_s:.1f} s; saved {p('model.netcl')}, {p('checkpoint.netcl')}, "
          f"{p('training_curve.png')}")

    # 3. export and compare on the test set
    model = load(p("model.netcl")).eval()
    _, _, meta = load_checkpoint(p("checkpoint.netcl"))
    export_onnx(model, (1, 1, 8, 8), p("model.onnx"), dynamic_batch=True)
    sess = ort_session(p("model.onnx"))
    acc_nc, logits_nc = recipes.accuracy(model, q, x_te, y_te)
    logits_ort = sess.run(None, {"input": x_te})[0]
    acc_ort = float((logits_ort.argmax(1) == y_te).mean())
    same = float((logits_ort.argmax(1) == logits_nc.argmax(1)).mean())
    diff = float(np.abs(logits_ort - logits_nc).max())
    # one warm-up run builds kernels and buffers; predict() is the inference call (numpy in and out;
    # on PoCL it runs a call this small on the serial device: docs/inference.md)
    lat_nc = 1e3 * median_time(lambda: model.predict(x_te[:1]), args.repeats, warmup=1)
    lat_ort = 1e3 * median_time(lambda: sess.run(None, {"input": x_te[:1]}), args.repeats, warmup=1)
    ok_digits = np.allclose(logits_nc, logits_ort, atol=ATOL, rtol=RTOL)
    print("\ndigits CNN, test set of", len(x_te))
    print(f"  {'':14s} {'accuracy':>9s} {'latency (batch 1)':>18s}")
    print(f"  {'netcl':14s} {acc_nc:9.4f} {lat_nc:15.3f} ms")
    print(f"  {'onnxruntime':14s} {acc_ort:9.4f} {lat_ort:15.3f} ms")
    print(f"  identical predictions: {same:.4f}; max abs difference of the logits: {diff:.3g} "
          f"({'OK' if ok_digits else 'MISMATCH'}); checkpoint epoch {meta.get('epoch')}")

    ok_det = True
    if not args.skip_detector:
        # 5. detector26 on photographs
        netcl.manual_seed(args.seed)
        det = models.detector26()
        t0 = time.perf_counter()
        recipes.calibrate_batchnorm(det, q, recipes.photo_crops(16, seed=args.seed))
        photos = recipes.photos(256)
        export_onnx(det, (1, 3, 256, 256), p("detector26.onnx"), dynamic_batch=True)
        out_nc = det(Tensor.from_host(q, photos)).to_host()
        out_ort = ort_session(p("detector26.onnx")).run(None, {"input": photos})[0]
        d = float(np.abs(out_nc - out_ort).max())
        ok_det = np.allclose(out_nc, out_ort, atol=ATOL, rtol=RTOL)
        print(f"\ndetector26 (BatchNorm calibrated on 16 photo crops), 2 photographs at 256x256 "
              f"(china.jpg, flower.jpg): output {out_nc.shape}, max abs difference netcl vs onnxruntime "
              f"{d:.3g} ({'OK' if ok_det else 'MISMATCH'}) [{time.perf_counter() - t0:.1f} s]")
    ok_vit = True
    if not args.skip_vit:
        # 6. a transformer on the digits
        t0 = time.perf_counter()
        vit, _, vhist = recipes.train_reference("vit_tiny", q, epochs=args.vit_epochs, seed=args.seed)
        save(vit, p("vit_tiny.netcl"))
        vit = load(p("vit_tiny.netcl")).eval()
        export_onnx(vit, (1, 1, 8, 8), p("vit_tiny.onnx"), dynamic_batch=True)
        acc_v, logits_v = recipes.accuracy(vit, q, x_te, y_te)
        logits_vo = ort_session(p("vit_tiny.onnx")).run(None, {"input": x_te})[0]
        d = float(np.abs(logits_v - logits_vo).max())
        ok_vit = np.allclose(logits_v, logits_vo, atol=ATOL, rtol=RTOL)
        print(f"\nvit_tiny: {len(vhist['epoch'])} epochs in {time.perf_counter() - t0:.1f} s, test accuracy "
              f"{acc_v:.4f} (onnxruntime {float((logits_vo.argmax(1) == y_te).mean()):.4f}); max abs difference of "
              f"the logits {d:.3g} ({'OK' if ok_vit else 'MISMATCH'}); saved {p('vit_tiny.netcl')}, "
              f"{p('vit_tiny.onnx')}")
    if not (ok_digits and ok_det and ok_vit):
        print("export verification FAILED", file=sys.stderr)
        return 1
    print("\nall exports verified against onnxruntime")
    return 0


if __name__ == "__main__":
    sys.exit(main())
