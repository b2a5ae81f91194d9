#!/usr/bin/env python3
"""Train the reference architectures of netcl.models on real data and report what they reach:
resnet8, vit_tiny and mobilenetv2_tiny on scikit-learn's digits (test accuracy), unet_tiny on the
digits' foreground masks (test IoU). Settings: netcl.apps.recipes.REFERENCE_TRAINING.

    python tools/train_reference.py                      # all four
    python tools/train_reference.py --models vit_tiny --epochs 5
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import netcl  # noqa: E402
from netcl import models  # noqa: E402
from netcl.apps import common, recipes  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", type=common.names, default=["resnet8", "vit_tiny", "mobilenetv2_tiny", "unet_tiny"],
                    help="comma-separated")
    ap.add_argument("--epochs", type=common.positive_int, default=None, help="override the recipe's epochs")
    ap.add_argument("--device", default=None, help="NETCL_DEVICE spec: gpu, cpu or a name substring")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    q = netcl.default_queue(args.device)
    print(f"device: {q.device.name.strip()}")
    rows = []
    for name in args.models:
        t0 = time.perf_counter()
        if name == "unet_tiny":
            netcl.manual_seed(0)
            model = models.build(name)
            _, hist = recipes.train_segmentation(model, q, recipes.digits_masks(64), epochs=args.epochs or 6,
                                                 progress=not args.quiet)
            rows.append((name, "test IoU", hist["test_iou"][-1], len(hist["epoch"]), time.perf_counter() - t0))
        elif name in recipes.REFERENCE_TRAINING:
            _, _, hist = recipes.train_reference(name, q, epochs=args.epochs, progress=not args.quiet)
            rows.append((name, "test accuracy", hist["test_acc"][-1], len(hist["epoch"]), time.perf_counter() - t0))
        else:
            ap.error(f"no training recipe for {name!r}; expected some of "
                     f"{list(recipes.REFERENCE_TRAINING) + ['unet_tiny']}")
    print(f"\n{'model':18s} {'metric':14s} {'value':>7s} {'epochs':>6s} {'seconds':>8s}")
    for name, metric, value, epochs, secs in rows:
        print(f"{name:18s} {metric:14s} {value:7.3f} {epochs:6d} {secs:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
