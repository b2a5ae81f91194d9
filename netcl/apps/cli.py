"""The `netcl` command: devices, train, export, import, verify, bench, warmup. `netcl COMMAND --help` for each.

Exit codes: 0 success, 1 verification mismatch, 2 bad usage or input, 3 no OpenCL device.
"""
import argparse
import os
import sys

import numpy as np

import netcl
from netcl.apps import common, recipes
from netcl.apps.bench import main as bench_main
from netcl.apps.verify import verify
from netcl.errors import CompileError, FormatError, NoDeviceError
from netcl.io import export_onnx, export_test_case, import_onnx, load, load_checkpoint, save, save_checkpoint
from netcl.io.onnx_export import TARGETS, resolve_opset
from netcl.runtime import select_device
from netcl.runtime.device import _all_devices, compile_error, is_serial
from netcl.runtime.program import _hint
from netcl.warmup import compile_model


def _load_model(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such model file: {path}")
    return load(path)


# -- commands ----------------------------------------------------------------------------
def cmd_devices(args):
    """`netcl devices [--check]`: list the OpenCL devices and mark the selected one; --check probes each."""
    chosen = select_device(probe=False)  # listed even where it fails the probe (--check says so)
    bad = False
    for d, (_, dev) in zip(netcl.devices(), _all_devices()):
        note = ""
        if is_serial(dev):
            note = "  <- serial: kernels run in the calling thread; predict() uses it for small calls"
        if args.check:
            err = compile_error(dev)
            note += "  [builds kernels]" if err is None else f"  [CANNOT BUILD: {_first_error_line(err)}]"
            bad = bad or (err is not None and dev == chosen)
        print(f"{'*' if dev == chosen else ' '} {d}{note}")
    print("(* = selected; set NETCL_DEVICE=gpu|cpu|<name substring> to choose; NETCL_CPU_SERIAL=0: no serial device)")
    if bad:
        print(f"error: the selected device cannot build kernels{_hint(compile_error(chosen)) or '.'}", file=sys.stderr)
        return 3
    return 0


def _first_error_line(err):
    lines = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("error:")]
    return lines[0] if lines else err.splitlines()[0]


def cmd_train(args):
    """`netcl train`: the digits recipe through TrainStep, with checkpoints and resuming."""
    q = netcl.default_queue()
    print(f"device: {q.device.name.strip()}")
    netcl.manual_seed(args.seed)
    data = recipes.digits_data(seed=args.seed)
    opt, start = None, 0
    if args.resume:
        model, opt, meta = load_checkpoint(args.resume)
        start = int(meta.get("epoch") or 0)
        if meta.get("recipe") != "digits":
            raise ValueError(f"{args.resume} is not a checkpoint of the digits recipe (recipe: {meta.get('recipe')!r})")
        if start >= args.epochs:
            raise ValueError(f"{args.resume} is already at epoch {start}; ask for more with --epochs N > {start}")
        print(f"resuming from {args.resume} at epoch {start}")
    else:
        model = recipes.digits_cnn()
    ckpt = args.checkpoint

    def on_epoch(epoch, m, o):
        if ckpt:
            save_checkpoint(ckpt, m, o, epoch=epoch, recipe="digits")

    opt, hist = recipes.train_classifier(model, q, data, epochs=args.epochs, batch_size=args.batch_size,
                                         lr=args.lr, seed=args.seed, optimizer=opt, start_epoch=start,
                                         progress=not args.quiet, on_epoch=on_epoch)
    save(model, args.out)
    acc = hist["test_acc"][-1] if hist["test_acc"] else float("nan")
    print(f"saved {args.out}; test accuracy {acc:.4f}" + (f"; checkpoint {ckpt}" if ckpt else ""))
    return 0


def cmd_export(args):
    """`netcl export MODEL.netcl OUT.onnx --input-shape ...`: export_onnx (and export_test_case)."""
    model = _load_model(args.model).eval()
    options = dict(opset=args.opset, target=args.target, dynamic_batch=args.dynamic_batch,
                   input_name=args.input_name, output_name=args.output_name, metadata=dict(args.metadata or []),
                   doc_string=args.doc_string)
    export_onnx(model, args.input_shape, args.out, **options, **({"external_data": True} if args.external_data else {}))
    opset, _ = resolve_opset(args.opset, args.target)
    print(f"wrote {args.out} (opset {opset}, input {args.input_name} {tuple(args.input_shape)})")
    if args.test_case:
        x = np.random.default_rng(0).standard_normal(args.input_shape).astype(np.float32)
        export_test_case(model, x, args.test_case, **options)
        print(f"wrote the test case {os.path.join(args.test_case, 'model.onnx')} and test_data_set_0/ "
              "(a standard-normal input and netcl's output)")
    return 0


def cmd_import(args):
    """`netcl import MODEL.onnx OUT.netcl`: import_onnx, then save."""
    model = import_onnx(args.model)
    save(model, args.out)
    print(f"wrote {args.out}: {len(list(model.chain()))} layers, "
          f"{sum(int(np.prod(p.shape)) for p in model.parameters())} parameters")
    return 0


def _metadata(text):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, value


def cmd_verify(args):
    """`netcl verify MODEL.netcl --input-shape ...`: netcl against onnxruntime; exit 1 on a mismatch."""
    if args.device:
        os.environ["NETCL_DEVICE"] = args.device
    model = _load_model(args.model).eval()
    report = verify(model, args.input_shape, provider=args.provider, atol=args.atol, rtol=args.rtol,
                    seed=args.seed, opset=args.opset)
    print(f"{args.model}: netcl vs onnxruntime on a standard-normal input of shape {tuple(args.input_shape)}, "
          f"output {report.netcl_output.shape}")
    print(report.HEADER)
    print(report.row())
    print("OK" if report.ok else f"MISMATCH: not allclose(atol={args.atol:g}, rtol={args.rtol:g})")
    return 0 if report.ok else 1


def cmd_warmup(args):
    """Build the kernels a .netcl model needs at the given batch sizes into the kernel cache."""
    model = _load_model(args.model)
    q = netcl.default_queue(args.device)
    loss_fn = optimizer = None
    if args.train:
        out = model.output_shape((1,) + tuple(args.input_shape))
        kind = args.loss or ("cross_entropy" if len(out) == 2 else "mse")
        loss_fn = netcl.nn.CrossEntropyLoss() if kind == "cross_entropy" else netcl.nn.MSELoss()
        make = {"sgd": lambda ps: netcl.optim.SGD(ps, lr=0.01, momentum=0.9), "adam": lambda ps: netcl.optim.Adam(ps)}
        optimizer = make[args.optimizer](model.parameters())
    what = "training steps" if args.train else "predict()"
    for batch in args.batch:
        x = np.zeros((batch,) + tuple(args.input_shape), np.float32)
        done = compile_model(model, x, train=args.train, loss_fn=loss_fn, optimizer=optimizer,
                             queue=q if args.device else None)  # (predict()'s own choice of queue otherwise)
        print(f"{args.model}: {what} at batch {batch}, input {tuple(args.input_shape)}: "
              f"{done['programs']} programs built in {done['seconds']:.1f} s on {q.device.name.strip()}")
    return 0


def cmd_bench(args):
    """`netcl bench ...`: netcl.apps.bench.main with the remaining arguments."""
    rest = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    return bench_main(rest, prog="netcl bench")


def build_parser():
    """The argparse parser of the `netcl` command and its subcommands."""
    ap = argparse.ArgumentParser(prog="netcl", description="netcl: deep learning on OpenCL, exported to ONNX.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("devices", help="list OpenCL devices and the one netcl selects")
    p.add_argument("--check", action="store_true",
                   help="build and run netcl's probe kernels (float16 fma, fmax, exp; in a child process, "
                        "the verdict cached) on each device; exit 3 if the selected one fails")
    p.set_defaults(fn=cmd_devices)

    p = sub.add_parser("train", help="train the digits CNN recipe and save a .netcl model")
    p.add_argument("--out", default="model.netcl", help="where to save the trained model (default model.netcl)")
    p.add_argument("--epochs", type=common.positive_int, default=10, help="total epochs (default 10)")
    p.add_argument("--batch-size", type=common.positive_int, default=64)
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", help="save a training checkpoint here after every epoch")
    p.add_argument("--resume", help="continue from this checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("export", help="export a .netcl model to ONNX")
    p.add_argument("model", help="the .netcl file")
    p.add_argument("out", help="the .onnx file to write")
    p.add_argument("--input-shape", type=common.shape, required=True, help="e.g. 1,3,256,256 (batch first)")
    p.add_argument("--opset", type=int, help="ONNX opset, 11 to 25 (default 17, or the highest --target reads)")
    p.add_argument("--target", metavar="CONSUMER-VERSION",
                   help="the consumer that will read the file; the export takes the highest opset and IR version it "
                        f"reads. Known: {', '.join(TARGETS)}")
    p.add_argument("--metadata", type=_metadata, action="append", metavar="KEY=VALUE",
                   help="a metadata_props entry (repeatable), e.g. --metadata labels=cat,dog")
    p.add_argument("--doc-string", default="", help="the model's doc_string")
    p.add_argument("--test-case", metavar="DIR",
                   help="also write DIR/model.onnx and DIR/test_data_set_0/{input_0,output_0}.pb (the ONNX "
                        "backend-test layout: a standard-normal input and netcl's output)")
    p.add_argument("--dynamic-batch", action="store_true", help="make the batch dimension symbolic")
    p.add_argument("--input-name", default="input")
    p.add_argument("--output-name", default="output")
    p.add_argument("--external-data", action="store_true", help="store weights in a side file (.onnx.data)")
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("import", help="import an ONNX model into a .netcl file")
    p.add_argument("model", help="the .onnx file (netcl's own, or a graph of the ops netcl converts)")
    p.add_argument("out", help="the .netcl file to write")
    p.set_defaults(fn=cmd_import)

    p = sub.add_parser("verify", help="run netcl and onnxruntime on the same input; exit 1 on mismatch")
    p.add_argument("model", help="the .netcl file")
    p.add_argument("--input-shape", type=common.shape, required=True, help="e.g. 1,3,256,256")
    p.add_argument("--provider", choices=common.PROVIDERS, default="cpu", help="onnxruntime execution provider")
    p.add_argument("--device", help="netcl's OpenCL device (gpu, cpu or a name substring)")
    p.add_argument("--atol", type=float, default=1e-4)
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--seed", type=int, default=0, help="seed of the random input")
    p.set_defaults(fn=cmd_verify)

    p = sub.add_parser("warmup", help="build the kernels a model needs into the kernel cache (ahead of its first call)")
    p.add_argument("model", help="the .netcl file")
    p.add_argument("--input-shape", type=common.shape, required=True, help="one sample's shape, e.g. 3,32,32")
    p.add_argument("--batch", type=common.positive_ints, default=(1,), help="batch sizes, e.g. 1,32 (default 1)")
    p.add_argument("--train", action="store_true", help="a training step's kernels (default: predict()'s)")
    p.add_argument("--loss", choices=("cross_entropy", "mse"),
                   help="--train's loss (default: cross_entropy for a (N, classes) output, else mse)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="--train's optimizer kind")
    p.add_argument("--device", help="netcl's OpenCL device (gpu, cpu or a name substring)")
    p.set_defaults(fn=cmd_warmup)

    p = sub.add_parser("bench", help="benchmark netcl against onnxruntime (options: netcl bench --help)",
                       add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_bench)
    return ap


def main(argv=None):
    """The `netcl` console script: run a subcommand; returns the exit code (0 success, 1 mismatch,
    2 bad input, 3 no OpenCL device)."""
    ap = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # bench has its own option parser (netcl.apps.bench.main)
        args = argparse.Namespace(command="bench", fn=cmd_bench, bench_args=argv[1:])
    else:
        args = ap.parse_args(argv)
    if not getattr(args, "fn", None):
        ap.print_help()
        return 2
    try:
        return args.fn(args)
    except NoDeviceError as e:
        print(f"netcl: {e}", file=sys.stderr)
        return 3
    except (FormatError, OSError, ValueError, TypeError, NotImplementedError, ImportError, CompileError,
            RuntimeError) as e:  # exit 1 is reserved for a verification mismatch
        print(f"netcl {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
