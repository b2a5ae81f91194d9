"""float32 error of netcl's 3x3 convolution kernels on the default device, against float64 on the
same float32 inputs: the training path's Winograd F(2x2, 3x3) (conv_winot.cl, a Conv2d in training
mode, NETCL_CPU_WINOT=1), and the fused inference path's F(2x2, 3x3) and F(4x4, 3x3) (conv_wino.cl,
NETCL_CPU_WINO=2 and 4) and direct kernel (NETCL_CPU_WINO=0). F(4x4) needs 1.8x fewer multiply-adds
than F(2x2); this measures what it costs in accuracy.

    python tools/winograd_error.py                    # 16, 64 and 256 input channels
    python tools/winograd_error.py --channels 32 --size 32
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from netcl.apps import common  # noqa: E402

# label -> (environment, training mode): each kernel as netcl chooses it under that environment
KERNELS = {
    "direct": ({"NETCL_CPU_WINO": "0"}, False),
    "F(2x2) training": ({"NETCL_CPU_WINOT": "1"}, True),
    "F(2x2) inference": ({"NETCL_CPU_WINO": "2", "NETCL_CPU_WINOT": "0"}, False),
    "F(4x4) inference": ({"NETCL_CPU_WINO": "4", "NETCL_CPU_WINOT": "0"}, False),
}


def reference(x, w):
    # x: (C, H, W), w: (K, C, 3, 3) -> (K, H, W), float64, padding 1
    c, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    return np.einsum("kcij,cijhw->khw", w.astype(np.float64),
                     np.stack([np.stack([xp[:, i:i + h, j:j + wd] for j in range(3)], 1) for i in range(3)], 1))


def netcl_conv(x, w, env, training):
    """netcl's Conv2d (padding 1, no bias) of x (C, H, W) with w under `env`: a training forward, or
    the fused inference path's predict() (whose plan reads the environment when it is made)."""
    import netcl
    from netcl import nn

    saved = {k: os.environ.pop(k, None) for k in ("NETCL_CPU_WINO", "NETCL_CPU_WINOT")}
    os.environ.update(env)
    try:
        q = netcl.default_queue()
        model = nn.Sequential(nn.Conv2d(w.shape[1], w.shape[0], 3, padding=1, bias=False)).to(q)
        model.load_state_dict({"0.weight": w})
        if training:
            return model.train()(netcl.Tensor.from_host(q, x[None])).to_host()[0]
        return model.eval().predict(x[None])[0]
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def errors(c, k=16, size=16, seed=0):
    """{kernel label: max |error| / max |output|} for c -> k channels on size x size planes."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((c, size, size)).astype(np.float32)
    w = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    ref = reference(x, w)
    scale = np.abs(ref).max()
    return {label: float(np.abs(netcl_conv(x, w, env, training) - ref).max() / scale)
            for label, (env, training) in KERNELS.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--channels", type=common.positive_ints, default=(16, 64, 256),
                    help="comma-separated input channel counts")
    ap.add_argument("--out-channels", type=common.positive_int, default=16)
    ap.add_argument("--size", type=common.positive_int, default=16, help="planes of size x size")
    args = ap.parse_args()
    print("max |error| / max |output| against float64 on the same float32 inputs")
    for c in args.channels:
        e = errors(c, args.out_channels, args.size)
        cells = "  ".join(f"{label} {v:.2e}" for label, v in e.items())
        print(f"{c:4d} channels: {cells}  F(4x4) / F(2x2) inference {e['F(4x4) inference'] / e['F(2x2) inference']:.1f}x")


if __name__ == "__main__":
    main()
