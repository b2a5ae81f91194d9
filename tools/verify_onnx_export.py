#!/usr/bin/env python3
"""Export models to ONNX and check onnxruntime against netcl on the same input.

For each model (.netcl files, and/or the reference models of netcl.models) and each batch
size: export with a symbolic batch, run netcl (on $NETCL_DEVICE / --device) and onnxruntime
(--provider cpu or cuda) on the same input, print a table (model, batch, provider, max abs
diff, allclose) and exit 1 if any pair disagrees (np.allclose, atol 1e-4, rtol 1e-3).

Reference models get realistic batch-norm statistics first: calibrated on the photographs
shipped with scikit-learn (noise without it), and detector26 is checked on those photographs.

    python tools/verify_onnx_export.py                         # mlp, cnn, detector26 on CPU
    python tools/verify_onnx_export.py --provider cuda --device gpu
    python tools/verify_onnx_export.py model.netcl --input-shape 1,8,8 --batch 1,16
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from netcl.apps import common  # noqa: E402


def reference_model(name, queue, seed):
    """A reference model with batch-norm statistics set from data, and its inputs' source."""
    import netcl
    from netcl import models
    from netcl.apps import recipes

    netcl.manual_seed(seed)
    model = models.build(name)
    shape = models.MODELS[name].input_shape
    source = recipes.calibrate_batchnorm_on_photos(model, queue, shape, count=8, batch_size=4, seed=seed)
    photos = recipes.photos(shape[-1]) if source == "photos" and name == "detector26" else None
    return model.eval(), shape, photos


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help=".netcl model files (need --input-shape)")
    ap.add_argument("--model", action="append", choices=["mlp", "cnn", "detector26"],
                    help="a reference model (repeatable); default: all three when no file is given")
    ap.add_argument("--input-shape", type=common.shape, help="per-sample input shape of the .netcl files, e.g. 3,32,32 "
                                                             "(a leading batch size is also accepted and ignored)")
    ap.add_argument("--batch", type=common.positive_ints, default=(1, 4), help="batch sizes to run (default 1,4)")
    ap.add_argument("--provider", choices=common.PROVIDERS, default="cpu",
                    help="onnxruntime execution provider; cuda means CUDAExecutionProvider with use_tf32=0, "
                         "checked to be really in use")
    ap.add_argument("--device", help="netcl's OpenCL device: gpu, cpu or a platform/device name substring "
                                     "(sets NETCL_DEVICE)")
    ap.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's, 17)")
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.device:
        os.environ["NETCL_DEVICE"] = args.device
    if args.files and not args.input_shape:
        ap.error("--input-shape is needed for .netcl files")

    import netcl
    from netcl.apps.verify import VerifyResult, verify

    q = netcl.default_queue()
    print(f"netcl device: {q.device.name.strip()} ({q.device.platform.name.strip()})")
    jobs = []  # (label, model, per-sample shape, photos or None)
    if args.files:
        from netcl.io import load

        for path in args.files:
            model = load(path).eval()
            shape = args.input_shape
            try:  # the shape with or without a batch size, whichever fits
                model.output_shape((1,) + shape)
            except ValueError:
                shape = shape[1:]
            jobs.append((os.path.basename(path), model, shape, None))
    for name in args.model or ([] if args.files else ["mlp", "cnn", "detector26"]):
        jobs.append((name,) + reference_model(name, q, args.seed))

    rng = np.random.default_rng(args.seed)
    print(f"\n{'model':16s} {VerifyResult.HEADER}")
    ok = True
    for label, model, shape, photos in jobs:
        for n in args.batch:
            if photos is not None:
                x = np.concatenate([photos] * -(-n // len(photos)))[:n]
            else:
                x = rng.standard_normal((n,) + tuple(shape)).astype(np.float32)
            r = verify(model, x, provider=args.provider, queue=q, opset=args.opset, atol=args.atol, rtol=args.rtol)
            print(f"{label[:16]:16s} {r.row()}", flush=True)
            ok &= r.ok
    print("\nall exports agree with netcl" if ok else "\nMISMATCH: some exports disagree with netcl")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
