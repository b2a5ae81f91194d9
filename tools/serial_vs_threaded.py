"""predict() on PoCL's two CPU devices: the serial one (`basic`, kernels run in the calling thread)
against the threaded one (`pthread`, netcl's CPU device), per reference model and batch size, with
each call's multiply-accumulates (Module.macs): the measurement behind runtime.SERIAL_MACS, the
bound under which predict() takes the serial device.

    python tools/serial_vs_threaded.py
    python tools/serial_vs_threaded.py --models resnet8,vit_tiny --batches 1,2,4,8,16 --rounds 5

Interleaved medians: the two devices take turns, --rounds times, --calls calls each per turn
(scaled down with the batch), after warm-up; the outputs are checked to agree first."""
import argparse
import sys
import time

import numpy as np

import netcl
from netcl import models, runtime

SHAPES = {"resnet8": (3, 32, 32), "mobilenetv2_tiny": (3, 32, 32), "vit_tiny": (1, 8, 8),
          "unet_tiny": (3, 64, 64), "detector26": (3, 256, 256), "cnn": (3, 32, 32), "mlp": (64,)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet8,mobilenetv2_tiny,vit_tiny,unet_tiny,cnn",
                    help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=300, help="calls per turn at batch 1 (divided by the batch)")
    args = ap.parse_args(argv)
    threaded = netcl.default_queue()
    serial = runtime.serial_queue(threaded)
    if serial is None:
        sys.exit(f"no PoCL serial device next to {threaded.device.name.strip()} (NETCL_CPU_SERIAL=0, "
                 "POCL_DEVICES set without 'basic', or not PoCL)")
    rng = np.random.default_rng(0)
    print(f"threaded: {threaded.device.name.strip()}; serial: {serial.device.name.strip()}; "
          f"predict() bound: {runtime.SERIAL_MACS / 1e6:.0f} M multiply-accumulates")
    for name in args.models.split(","):
        if name not in SHAPES:
            sys.exit(f"unknown model {name!r}; expected one of {', '.join(SHAPES)}")
        model = getattr(models, name)().eval()
        for b in (int(v) for v in args.batches.split(",")):
            x = rng.normal(size=(b,) + SHAPES[name]).astype(np.float32)
            y_t, y_s = model.predict(x, threaded), model.predict(x, serial)
            if not np.allclose(y_t, y_s, rtol=1e-5, atol=1e-6):
                sys.exit(f"{name} batch {b}: the devices disagree by {np.abs(y_t - y_s).max():.3g}")
            calls = max(5, args.calls // b)
            times = {"threaded": [], "serial": []}
            for q in (threaded, serial):
                for _ in range(3):
                    model.predict(x, q)
            for _ in range(args.rounds):
                for key, q in (("threaded", threaded), ("serial", serial)):
                    for _ in range(calls):
                        t = time.perf_counter()
                        model.predict(x, q)
                        times[key].append(time.perf_counter() - t)
            t_t, t_s = (1e3 * float(np.median(times[k])) for k in ("threaded", "serial"))
            print(f"{name:18s} batch {b:3d}  {model.macs(x.shape) / 1e6:7.1f} M MAC  threaded {t_t:7.3f} ms  "
                  f"serial {t_s:7.3f} ms  serial / threaded {t_s / t_t:.2f}", flush=True)


if __name__ == "__main__":
    main()
