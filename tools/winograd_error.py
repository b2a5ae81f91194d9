"""float32 error of Winograd F(2x2, 3x3), which netcl's CPU training convolutions run (conv_winot.cl),
against F(4x4, 3x3), which would need 1.8x fewer multiply-adds, and a direct convolution: each
emulated in numpy float32 (transforms, products and the sum over input channels rounded to float32
in the kernels' order), measured against float64 on the same float32 inputs. With --netcl, netcl's
own Conv2d forward (Winograd forced: NETCL_CPU_WINOT=1) on the default device beside them, which
checks the emulation against the kernel it stands for.

    python tools/winograd_error.py                    # 16, 64 and 256 input channels
    python tools/winograd_error.py --channels 32 --netcl
"""
import argparse
import os

import numpy as np

# Lavin & Gray's matrices (B^T, G, A^T) for output tiles of 2 and 4, interpolation points 0, +-1 (+-2)
_WINOGRAD = {
    2: ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
         [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
         [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}


def winograd(xp, w, m, dtype):
    # xp: (C, H + 2, W + 2) zero-bordered, w: (K, C, 3, 3) -> (K, H, W); H, W multiples of m
    bt, g, at = (np.array(a, dtype) for a in _WINOGRAD[m])
    a, (c, hp, wp) = m + 2, xp.shape
    th, tw = (hp - 2) // m, (wp - 2) // m
    u = np.einsum("ij,kcjl,ml->kcim", g, w.astype(dtype), g).astype(dtype)  # (K, C, a, a)
    tiles = np.stack([np.stack([xp[:, i * m:i * m + a, j * m:j * m + a] for j in range(tw)], 1)
                      for i in range(th)], 1).astype(dtype)  # (C, TH, TW, a, a)
    v = np.einsum("ij,cxyjl,ml->cxyim", bt, tiles, bt).astype(dtype)
    acc = np.zeros((w.shape[0], th, tw, a, a), dtype)
    for ci in range(c):  # the products summed channel by channel, as the kernel's multiply-adds
        acc = (acc + u[:, ci, None, None] * v[ci]).astype(dtype)
    y = np.einsum("ij,kxyjl,ml->kxyim", at, acc, at).astype(dtype)  # (K, TH, TW, m, m)
    return y.transpose(0, 1, 3, 2, 4).reshape(w.shape[0], th * m, tw * m)


def direct(xp, w, dtype):
    c, hp, wp = xp.shape
    y = np.zeros((w.shape[0], hp - 2, wp - 2), dtype)
    for ci in range(c):
        for i in range(3):
            for j in range(3):
                y = (y + w[:, ci, i, j].astype(dtype)[:, None, None] * xp[ci, i:i + hp - 2, j:j + wp - 2]).astype(dtype)
    return y


def netcl_conv(x, w):
    """netcl's Conv2d training forward of x (N, C, H, W) on the default device, Winograd forced."""
    os.environ["NETCL_CPU_WINOT"] = "1"
    import netcl
    from netcl import nn

    q = netcl.default_queue()
    conv = nn.Conv2d(w.shape[1], w.shape[0], 3, padding=1, bias=False)
    conv.load_state_dict({"weight": w.astype(np.float32)})
    return conv.to(q)(netcl.Tensor.from_host(q, x.astype(np.float32))).to_host()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--channels", default="16,64,256", help="comma-separated input channel counts")
    ap.add_argument("--out-channels", type=int, default=16)
    ap.add_argument("--size", type=int, default=16, help="planes of size x size (a multiple of 4)")
    ap.add_argument("--netcl", action="store_true", help="also netcl's Conv2d (Winograd forced) on the default device")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    k, s = args.out_channels, args.size
    print("max |error| / max |output| against float64 on the same float32 inputs")
    for c in (int(v) for v in args.channels.split(",")):
        x = rng.standard_normal((c, s, s)).astype(np.float32).astype(np.float64)
        w = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32).astype(np.float64)
        xp = np.pad(x, ((0, 0), (1, 1), (1, 1)))
        ref = direct(xp, w, np.float64)
        scale = np.abs(ref).max()
        err = {"direct": direct(xp, w, np.float32), "F(2x2,3x3)": winograd(xp, w, 2, np.float32),
               "F(4x4,3x3)": winograd(xp, w, 4, np.float32)}
        if args.netcl:
            err["netcl Conv2d"] = netcl_conv(x[None], w)[0]
        rel = {name: float(np.abs(y - ref).max() / scale) for name, y in err.items()}
        cells = "  ".join(f"{name} {e:.2e}" for name, e in rel.items())
        print(f"{c:4d} channels: {cells}  F(4x4) / F(2x2) {rel['F(4x4,3x3)'] / rel['F(2x2,3x3)']:.1f}x")


if __name__ == "__main__":
    main()
