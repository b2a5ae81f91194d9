"""The .netcl file: a model's architecture and weights, and training checkpoints.

Layout (integers little-endian):

    offset 0    8 bytes  magic b"\\x89NETCL\\r\\n" (the \\x89 and \\r\\n catch 7-bit and text-mode mangling)
           8    u32      format version (1)
          12    u32      header length H; the header is padded with spaces so that the data is 64-aligned
          16    H bytes  UTF-8 JSON header
        16+H             data: raw little-endian float32 tensors, each at a 64-aligned offset from here
      end-32             SHA-256 of every byte before it

The header holds "netcl_version", "kind" ("model" or "checkpoint"), "training", "architecture"
(a list of {"type", "config"}: a layer's name in nn.LAYERS and its constructor's keyword
arguments, plus "children", a list of [name, entry] pairs, for a layer that holds layers such as
a nested Sequential), "tensors" (a list of {"name", "shape", "dtype": "float32", "offset", "nbytes"}; names
are state_dict keys such as "0.weight", and "optimizer.<i>.<slot>") and "data_bytes". A checkpoint
adds "optimizer" ({"type", "hyper" (the constructor's settings), "params": indices into
model.parameters(), "scalars": {"<i>.step": int}, "groups": [{"params": how many of "params" in
order, setting: value, ...}]}; a file without "groups" has one group of the "hyper" settings),
"meta" (the epoch and the user's metadata), "rng" (netcl's random generator, so that a resumed run
draws the same dropout masks as the uninterrupted one) and, where one was given, "scheduler"
({"type", "config": its constructor's arguments, "state": its state_dict()}).

Reading executes nothing from the file: JSON only, layer and optimizer types from fixed
registries, config keys checked against the constructor, and every size in the header checked
against the file before anything is allocated. Any problem raises netcl.FormatError. Saving
streams tensors into a temporary file next to the target and renames it into place.
"""
import contextlib
import hashlib
import inspect
import json
import math
import os
import re
import struct

import numpy as np

from netcl import optim
from netcl.optim import lr_scheduler
from netcl.errors import FormatError
from netcl import nn
from netcl.io.atomic import AtomicFile, file_path
from netcl.nn import module as _module
from netcl.tensor import Tensor
from netcl.version import __version__

MAGIC = b"\x89NETCL\r\n"
FORMAT_VERSION = 1
ALIGN = 64
_PREAMBLE = struct.Struct("<8sII")  # magic, format version, header length
_DIGEST = 32  # sha256
_MAX_HEADER = 8 << 20  # bytes; a model of 10,000 layers and tensors needs about 3 MB
_MAX_VALUES = 1 << 19  # JSON values in the header ("[", "{" and "," counted in its raw bytes)
_MAX_TENSORS = 1 << 16
_MAX_LAYERS = 1 << 16
_MAX_NDIM = 8
_MAX_INT = 1 << 53  # config values, shapes and counts: anything larger is not a real model
_CHUNK = 1 << 20

OPTIMIZERS = {name: cls for name, cls in vars(optim).items()
              if isinstance(cls, type) and issubclass(cls, optim.Optimizer) and cls is not optim.Optimizer}

_MAX_DEPTH = 32  # nested blocks
_MAX_SCHEDULER_DEPTH = 4  # SequentialLRs inside SequentialLRs
_MAX_GROUPS = 1 << 12  # parameter groups of an optimizer
_MAX_NESTING = 3 * _MAX_DEPTH + 16  # JSON levels: each block adds three (children, pair, entry)
_BRACKET = np.zeros(256, np.int32)  # the nesting step of each byte value
_BRACKET[list(b"[{")], _BRACKET[list(b"]}")] = 1, -1
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")

_CHILD = re.compile(r"[A-Za-z0-9_]{1,64}")
_SETTING = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")  # a parameter group's setting ("lr", "initial_lr")
_STATE_KEY = re.compile(r"(0|[1-9][0-9]{0,8})\.([A-Za-z_][A-Za-z0-9_]{0,63})")
_RNG_TYPES = ("PCG64", "PCG64DXSM")  # numpy bit generators whose state is plain JSON


# ---------------------------------------------------------------------------------------
# saving
def save(model, path, example_input=None):
    """Write `model`: architecture and weights, no pickle. Atomic.

    Args:
        model: an nn.Sequential of netcl layers and blocks, an nn.GraphModule, or a Module subclass
            with a forward of its own, which is traced first (netcl.trace) with `example_input`, or
            with zeros of the shape of the input it was last called with.
        path: the file to write (replaced only once the new one is complete).
        example_input: an array or Tensor for tracing a Module subclass."""
    model = _recordable(model, example_input)
    _write(path, _model_header(model), _model_tensors(model))


def save_checkpoint(path, model, optimizer, epoch=None, scheduler=None, example_input=None, **meta):
    """Write a training checkpoint that load_checkpoint() resumes exactly. Atomic.

    Args:
        path: the .netcl file to write.
        model: the model (architecture and weights); a Module subclass with a forward of its own is
            traced as save() traces it (load_checkpoint gives back the GraphModule).
        optimizer: a netcl.optim optimizer of the model's parameters: its type, parameter groups
            (their settings, a schedule's learning rates included) and state.
        epoch: an int or None, returned in load_checkpoint's meta.
        scheduler: a netcl.optim.lr_scheduler scheduler of the optimizer, or None: its type,
            arguments and state (load_checkpoint's meta["scheduler"] is it rebuilt).
        example_input: an array or Tensor for tracing a Module subclass (as save's).
        **meta: more metadata (JSON values), returned in load_checkpoint's meta.

    netcl's random-generator state is saved too, so dropout masks and DataLoader shuffles continue
    as in the uninterrupted run.
    """
    model = _recordable(model, example_input)  # (a trace shares the model's parameters, in its order)
    header = _model_header(model)
    if not isinstance(optimizer, optim.Optimizer) or type(optimizer) not in OPTIMIZERS.values():
        raise TypeError(f"save_checkpoint expects a netcl.optim optimizer ({', '.join(OPTIMIZERS)}), "
                        f"got {type(optimizer).__name__}")
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer))):
        raise TypeError(f"epoch must be an int or None, got {type(epoch).__name__}")
    index = {id(p): i for i, p in enumerate(model.parameters())}
    if any(id(p) not in index for p in optimizer.params):
        raise ValueError("the optimizer updates tensors that are not parameters of the model; "
                         "build it over model.parameters() (or a subset of them)")
    hyper = optimizer.hyperparameters()
    problem = _config_problem(type(optimizer), hyper, lists=True)
    if problem:
        raise ValueError(f"cannot save {type(optimizer).__name__}: hyperparameter {problem}")
    sd = optimizer.state_dict()
    groups = []
    for g in sd["param_groups"]:
        entry = {"params": len(g["params"]), **{k: _plain_value(v) for k, v in g.items() if k != "params"}}
        problem = _group_problem(entry)
        if problem:
            raise ValueError(f"cannot save {type(optimizer).__name__}: parameter group {problem}")
        groups.append(entry)
    scalars, arrays = {}, []
    for i, st in sd["state"].items():
        for name, v in st.items():
            key = f"{i}.{name}"
            if isinstance(v, np.ndarray):
                arrays.append((f"optimizer.{key}", v.shape, lambda v=v: v))
            elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                scalars[key] = int(v)
            else:
                raise ValueError(f"cannot save optimizer state {key!r} of type {type(v).__name__}")
    header.update(kind="checkpoint",
                  optimizer={"type": type(optimizer).__name__, "hyper": hyper,
                             "params": [index[id(p)] for p in optimizer.params], "scalars": scalars,
                             "groups": groups},
                  meta={"epoch": None if epoch is None else int(epoch), **meta},
                  rng=_module.rng().bit_generator.state)
    if scheduler is not None:
        header["scheduler"] = _scheduler_entry(scheduler, optimizer)
    try:
        json.dumps(header["meta"], default=_json_default)
    except (TypeError, ValueError) as e:
        raise TypeError(f"checkpoint metadata must be JSON values (str, int, float, bool, None, lists, "
                        f"dicts with str keys): {e}") from None
    _write(path, header, _model_tensors(model) + arrays)


def _plain_value(v):
    return list(v) if isinstance(v, tuple) else v.item() if isinstance(v, np.generic) else v


def _scheduler_entry(scheduler, optimizer):
    """{"type", "config", "state"} of a scheduler of `optimizer`, checked as load_checkpoint checks it."""
    cls = lr_scheduler.SCHEDULERS.get(type(scheduler).__name__)
    if cls is not type(scheduler):
        raise TypeError(f"save_checkpoint's scheduler must be a netcl.optim.lr_scheduler scheduler "
                        f"({', '.join(lr_scheduler.SCHEDULERS)}), got {type(scheduler).__name__}")
    if scheduler.optimizer is not optimizer:
        raise ValueError("the scheduler schedules another optimizer than the one saved")
    entry = _scheduler_config(scheduler)
    entry["state"] = scheduler.state_dict()
    try:
        json.dumps(entry, default=_json_default)
    except (TypeError, ValueError) as e:
        raise ValueError(f"cannot save {type(scheduler).__name__}: its state is not plain data ({e})") from None
    return entry


def _scheduler_config(scheduler, depth=0):
    """{"type", "config"} of a scheduler (a SequentialLR's schedulers nested likewise), checked."""
    if depth > _MAX_SCHEDULER_DEPTH:
        raise ValueError(f"cannot save schedulers nested more than {_MAX_SCHEDULER_DEPTH} deep")
    name, config = type(scheduler).__name__, scheduler.config()
    if name == "SequentialLR":
        config["schedulers"] = [_scheduler_config(s, depth + 1) for s in scheduler._schedulers]
    else:
        problem = _config_problem(type(scheduler), config, lists=_MAX_GROUPS)
        if problem:
            raise ValueError(f"cannot save {name}: argument {problem} (a checkpoint holds data, not functions)")
    return {"type": name, "config": config}


def _recordable(model, example_input):
    """model as files and the exporter record it: a Module subclass with a forward of its own traced
    into a GraphModule (the traced forward's side effects undone: BatchNorm's running statistics and
    the random generator's state, which a dropout in training mode draws from)."""
    if not isinstance(model, nn.Module) or not model.own_forward_modules():
        return model
    if example_input is None:
        shape = model.__dict__.get("_input_shape")
        if shape is None:
            raise ValueError(f"{model.describe_own_forward()}: to record it, netcl traces its forward, which "
                             "needs an input: pass example_input=, or call the model once first")
        example_input = np.zeros(shape, np.float32)
    buffers = [(t, t.to_host()) for _, t in model.named_buffers()]
    state = _module.rng().bit_generator.state
    try:
        return nn.trace(model, example_input)
    finally:
        for t, a in buffers:
            t.set_(a)
        _module.rng().bit_generator.state = state


def _model_header(model):
    if isinstance(model, nn.Module) and model.IS_GRAPH:  # a graph is the root layer itself
        return {"netcl_version": _version(), "kind": "model", "training": bool(model.training), "root": "layer",
                "architecture": [_entry(model, "")]}
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"expected a netcl.nn.Sequential or GraphModule, got {type(model).__name__}")
    return {"netcl_version": _version(), "kind": "model", "training": bool(model.training),
            "architecture": architecture(model)}


def architecture(model):
    """The header's "architecture": one {"type", "config"(, "children")} entry per layer of `model`
    (also written into ONNX files, whose importer restores layers that emit no node from it)."""
    return [_entry(layer, name) for name, layer in model.named_children()]


def _entry(layer, path):
    """{"type", "config"} of a layer, plus "children" ([name, entry] pairs) for one that holds layers."""
    name = type(layer).__name__
    if nn.LAYERS.get(name) is not type(layer):
        raise ValueError(f"layer {path} ({name}) is not a netcl layer type that files can hold; "
                         f"supported: {', '.join(nn.LAYERS)}")
    config = layer.config()
    problem = _config_problem(type(layer), config)
    if problem:
        raise ValueError(f"cannot save layer {path} ({name}): config {problem}")
    entry = {"type": name, "config": config}
    children = layer.named_children()
    if children:
        entry["children"] = [[child, _entry(sub, _join(path, child))] for child, sub in children]
    return entry


def _join(path, name):
    return f"{path}.{name}" if path else name


def _model_tensors(model):
    out = []
    for name, t in model.named_tensors():
        if not isinstance(t, Tensor):
            raise TypeError(f"model tensor {name!r} is a {type(t).__name__}, not a netcl Tensor")
        out.append((name, t.shape, t.numpy))
    return out


def _write(path, header, tensors):
    """Stream the header and `tensors` ((name, shape, fetch) triples) into a new file that replaces
    `path` only once it is complete and on disk (AtomicFile): a failure leaves `path` as it was."""
    path = file_path(path, "save")
    table, end = [], 0
    for name, shape, _ in tensors:
        offset = -(-end // ALIGN) * ALIGN
        nbytes = 4 * int(np.prod(shape, dtype=np.int64))
        table.append({"name": name, "shape": list(shape), "dtype": "float32", "offset": offset, "nbytes": nbytes})
        end = offset + nbytes
    text = json.dumps({**header, "tensors": table, "data_bytes": end}, default=_json_default).encode()
    text += b" " * (-(_PREAMBLE.size + len(text)) % ALIGN)
    problem = _header_problem(text)
    if problem:
        raise ValueError(f"cannot save to {path!r}: the header {problem} (the metadata is too large?)")
    with AtomicFile(path, "save") as f:
        digest = hashlib.sha256()

        def put(b):
            f.write(b)
            digest.update(b)

        put(_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(text)) + text)
        pos = 0
        for (name, shape, fetch), entry in zip(tensors, table):
            a = np.asarray(fetch(), dtype="<f4", order="C")  # (ascontiguousarray makes a 0-d array 1-d)
            if a.shape != tuple(shape):
                raise ValueError(f"tensor {name!r} holds data of shape {a.shape}, expected {tuple(shape)}")
            put(bytes(entry["offset"] - pos))
            put(memoryview(a.reshape(-1)).cast("B"))
            pos = entry["offset"] + entry["nbytes"]
        f.write(digest.digest())


# ---------------------------------------------------------------------------------------
# loading
def load(path):
    """Read a .netcl file (a model or a checkpoint) -> nn.Sequential with host tensors (no device needed)."""
    with _Reader(path) as r:
        model = _build_model(r)
        r.check_all_used(ignore="optimizer.")  # a checkpoint's optimizer state is not the model's
    return model


def load_checkpoint(path):
    """Read a checkpoint -> (model, optimizer, meta); also restores netcl's random generator, so
    that training continues exactly as the uninterrupted run would. meta holds "epoch", the
    keyword metadata given to save_checkpoint and, where a scheduler was saved, "scheduler": it,
    rebuilt over the optimizer with its state."""
    with _Reader(path) as r:
        if r.header.get("kind") != "checkpoint":
            raise FormatError(f"{r.path}: this is a model file without optimizer state; use netcl.io.load()")
        model = _build_model(r)
        opt, sched = _build_optimizer(r, model)
        meta = r.header["meta"]
        if not isinstance(meta, dict) or "epoch" not in meta:
            raise FormatError(f"{r.path}: header 'meta' must be an object holding 'epoch'")
        if meta["epoch"] is not None and type(meta["epoch"]) is not int:
            raise FormatError(f"{r.path}: meta 'epoch' must be an integer or null, got {meta['epoch']!r}")
        rng = _rng_from(r)
        r.check_all_used()
    _module.set_rng(rng)  # only now: a failed load leaves the generator alone
    if sched is not None:
        meta = {**meta, "scheduler": sched}
    return model, opt, meta


_FIELDS = {"model": {"netcl_version", "kind", "training", "architecture", "tensors", "data_bytes"}}
_FIELDS["checkpoint"] = _FIELDS["model"] | {"optimizer", "meta", "rng"}
# "root": "layer": the architecture's one entry is the model (a GraphModule); a checkpoint's "scheduler"
_OPTIONAL = {"model": {"root"}, "checkpoint": {"root", "scheduler"}}


class _Reader:
    """An open .netcl file whose preamble, header, size, checksum and tensor table have been checked."""

    def __init__(self, path):
        self.path = file_path(path, "load")
        self.f = open(self.path, "rb")
        try:
            self._check()
        except BaseException:
            self.f.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def fail(self, msg):
        raise FormatError(f"{self.path}: {msg}")

    def _check(self):
        f, fail = self.f, self.fail
        size = os.fstat(f.fileno()).st_size
        pre = f.read(_PREAMBLE.size)
        if len(pre) < _PREAMBLE.size:
            fail(f"not a .netcl file: {'it is empty' if not pre else f'only {len(pre)} bytes'} "
                 f"(a .netcl file starts with a {_PREAMBLE.size}-byte preamble)")
        magic, version, hlen = _PREAMBLE.unpack(pre)
        if magic != MAGIC:
            hint = " (it looks like a Python pickle, which netcl never loads)" if pre[:1] == b"\x80" else ""
            fail(f"not a .netcl file: expected magic {MAGIC!r}, found {magic!r}{hint}")
        if not 1 <= version <= FORMAT_VERSION:
            fail(f"format version {version} is not supported: this netcl ({_version()}) reads versions "
                 f"1 to {FORMAT_VERSION}; a newer netcl wrote it?")
        if hlen > _MAX_HEADER:
            fail(f"header length {hlen} is more than the {_MAX_HEADER} bytes any model needs; corrupt or hostile")
        if hlen > size - _PREAMBLE.size - _DIGEST:
            fail(f"header length {hlen} does not fit: the file has {size} bytes "
                 f"(preamble {_PREAMBLE.size} + header + data + {_DIGEST}-byte checksum); truncated or corrupt")
        raw = f.read(hlen)
        problem = _header_problem(raw)
        if problem:
            fail(f"the header {problem}; corrupt or hostile")
        try:
            h = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            fail(f"header is not valid UTF-8 JSON (corrupt file): {e}")
        del raw
        if not isinstance(h, dict):
            fail(f"header must be a JSON object, got {type(h).__name__}")
        kind = h.get("kind")
        if not isinstance(kind, str) or kind not in _FIELDS:  # (a list or object is not hashable)
            fail(f"header 'kind' must be 'model' or 'checkpoint', got {kind!r}")
        optional = _OPTIONAL[kind]
        if not _FIELDS[kind] <= set(h) <= _FIELDS[kind] | optional:
            fail(f"header fields for a {kind} must be {sorted(_FIELDS[kind])} (and optionally "
                 f"{sorted(optional)}); missing {sorted(_FIELDS[kind] - set(h))}, unexpected "
                 f"{sorted(set(h) - _FIELDS[kind] - optional)}")
        if h.get("root", "layer") != "layer":
            fail(f"header 'root' must be 'layer' where present, got {h['root']!r:.50}")
        data = _count(h["data_bytes"], _MAX_INT)
        if data is None:
            fail(f"header 'data_bytes' must be a non-negative integer, got {h['data_bytes']!r}")
        self.base, expected = _PREAMBLE.size + hlen, _PREAMBLE.size + hlen + data + _DIGEST
        if size != expected:
            fail(f"truncated: the header describes {expected} bytes, the file has {size}" if size < expected else
                 f"{size - expected} unexpected bytes after the checksum (the header describes {expected})")
        digest, left = hashlib.sha256(), size - _DIGEST
        f.seek(0)
        while left:
            chunk = f.read(min(left, _CHUNK))
            if not chunk:
                fail("file shrank while being read")
            digest.update(chunk)
            left -= len(chunk)
        if digest.digest() != f.read(_DIGEST):
            fail("checksum mismatch: the file is corrupt (SHA-256 of its contents differs from the stored one)")
        if not isinstance(h["training"], bool) or not isinstance(h["netcl_version"], str):
            fail("header 'training' must be a boolean and 'netcl_version' a string")
        self.header, self.table = h, self._check_table(h["tensors"], data)
        self.used = set()

    def _check_table(self, tensors, data):
        fail = self.fail
        if not isinstance(tensors, list) or len(tensors) > _MAX_TENSORS:
            fail(f"header 'tensors' must be a list of at most {_MAX_TENSORS} entries")
        table, spans = {}, []
        keys = {"name", "shape", "dtype", "offset", "nbytes"}
        for e in tensors:
            if not isinstance(e, dict) or set(e) != keys:
                fail(f"each tensor entry must be an object with exactly the fields {sorted(keys)}, got {e!r:.200}")
            name, shape = e["name"], e["shape"]
            if not isinstance(name, str) or not 0 < len(name) <= 256 or name in table:
                fail(f"tensor names must be unique non-empty strings of at most 256 characters, got {name!r:.300}")
            if (not isinstance(shape, list) or len(shape) > _MAX_NDIM
                    or any(_count(s, _MAX_INT) is None for s in shape)):
                fail(f"tensor {name!r}: shape must be a list of at most {_MAX_NDIM} non-negative integers, "
                     f"got {shape!r:.200}")
            if e["dtype"] != "float32":
                fail(f"tensor {name!r}: dtype must be 'float32', got {e['dtype']!r:.50}")
            offset, nbytes, want = _count(e["offset"], _MAX_INT), _count(e["nbytes"], _MAX_INT), 4 * _prod(shape)
            if nbytes != want:
                fail(f"tensor {name!r}: nbytes {e['nbytes']!r:.50} does not match its shape {shape} "
                     f"(expected {want})")
            if offset is None or offset % ALIGN or offset + nbytes > data:
                fail(f"tensor {name!r}: offset {e['offset']!r:.50} with {nbytes} bytes is not a {ALIGN}-aligned "
                     f"range inside the {data}-byte data section")
            table[name] = (tuple(shape), offset, nbytes)
            if nbytes:
                spans.append((offset, offset + nbytes, name))
        spans.sort()
        for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
            if start < end:
                fail(f"tensors {a!r} and {b!r} overlap in the data section")
        return table

    def check(self, name, shape):
        """Fail unless the file holds tensor `name` with exactly `shape`."""
        if name not in self.table:
            self.fail(f"missing tensor {name!r} (shape {tuple(shape)})")
        if self.table[name][0] != tuple(shape):
            self.fail(f"tensor {name!r} has shape {self.table[name][0]}, the architecture needs {tuple(shape)}")

    def read(self, name, shape=None):
        """Tensor `name` as a float32 array (checked against `shape` when given)."""
        if name not in self.table:
            self.fail(f"missing tensor {name!r}")
        have, offset, nbytes = self.table[name]
        if shape is not None and have != tuple(shape):
            self.fail(f"tensor {name!r} has shape {have}, the architecture needs {tuple(shape)}")
        self.used.add(name)
        a = np.empty(have, "<f4")
        self.f.seek(self.base + offset)
        if self.f.readinto(memoryview(a.reshape(-1)).cast("B")) != nbytes:
            self.fail(f"tensor {name!r}: file shrank while being read")
        return a.astype(np.float32, copy=False)

    def check_all_used(self, ignore=None):
        extra = sorted(n for n in set(self.table) - self.used if not (ignore and n.startswith(ignore)))
        if extra:
            self.fail(f"tensors that the architecture does not use: {extra[:10]}")


def _build_model(r):
    arch = r.header["architecture"]
    if not isinstance(arch, list) or len(arch) > _MAX_LAYERS:
        r.fail(f"header 'architecture' must be a list of at most {_MAX_LAYERS} layers")
    budget = [_MAX_LAYERS]
    with _scratch_rng():  # building layers draws initial weights; keep the user's random stream untouched
        if r.header.get("root") == "layer":
            if len(arch) != 1:
                r.fail("header 'root' is 'layer': the architecture must hold exactly one layer")
            model = _build_layer(r, arch[0], "", 1, budget)
        else:
            children = {str(i): _build_layer(r, entry, str(i), 1, budget) for i, entry in enumerate(arch)}
            model = nn.Sequential(*children.values())
    for name, t in model.named_tensors():
        t.set_(r.read(name, t.shape))
    return model.train(r.header["training"])


def _build_layer(r, entry, path, depth, budget):
    """The layer described by `entry` at state_dict prefix `path`. Its tensors' names and shapes
    (the class's tensor_shapes of the config) are checked against the file's table before the
    layer is built, so a config can never make netcl allocate what the file does not hold."""
    budget[0] -= 1
    if budget[0] < 0 or depth > _MAX_DEPTH:
        r.fail(f"layer {path}: more than {_MAX_LAYERS} layers or {_MAX_DEPTH} levels of nesting")
    if not isinstance(entry, dict) or not {"type", "config"} <= set(entry) <= {"type", "config", "children"}:
        r.fail(f"layer {path}: expected an object with fields 'type', 'config' (and 'children'), got {entry!r:.200}")
    kind, config = entry["type"], entry["config"]
    cls = nn.LAYERS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        r.fail(f"layer {path}: unknown layer type {kind!r:.100}; expected one of {', '.join(nn.LAYERS)}")
    problem = _config_problem(cls, config)
    if problem:
        r.fail(f"layer {path} ({kind}): config {problem}")
    pairs = entry.get("children", [])
    if (not isinstance(pairs, list) or any(not isinstance(p, list) or len(p) != 2 or not isinstance(p[0], str)
                                           or not _CHILD.fullmatch(p[0]) for p in pairs)
            or len({p[0] for p in pairs}) != len(pairs)):
        r.fail(f"layer {path} ({kind}): 'children' must be a list of distinct [name, layer] pairs")
    try:
        shapes = cls.tensor_shapes(**_module.bound_config(cls, config))
    except (TypeError, ValueError, ArithmeticError) as e:
        r.fail(f"layer {path} ({kind}): invalid config {config!r:.200}: {e}")
    for name, shape in shapes.items():
        r.check(_join(path, name), shape)
    children = {name: _build_layer(r, sub, _join(path, name), depth + 1, budget) for name, sub in pairs}
    try:
        layer = cls.from_config(config, children)
    except (TypeError, ValueError, ArithmeticError) as e:
        r.fail(f"layer {path} ({kind}): invalid config {config!r:.200}: {e}")
    if [name for name, _ in layer.named_children()] != list(children):
        r.fail(f"layer {path} ({kind}): children {list(children)} do not match the layer's structure")
    return layer


def _build_optimizer(r, model):
    """The checkpoint's optimizer over `model`'s parameters, and its scheduler (or None), loaded in
    torch's resume order: the optimizer made, the scheduler made over it (which sets learning
    rates as at its construction), then both loaded with their saved state."""
    o = r.header["optimizer"]
    fields = {"type", "hyper", "params", "scalars"}
    if not isinstance(o, dict) or not fields <= set(o) <= fields | {"groups"}:
        r.fail(f"header 'optimizer' must be an object with fields {sorted(fields)} (and optionally 'groups')")
    cls = OPTIMIZERS.get(o["type"]) if isinstance(o["type"], str) else None
    if cls is None:
        r.fail(f"unknown optimizer type {o['type']!r:.100}; expected one of {', '.join(OPTIMIZERS)}")
    problem = _config_problem(cls, o["hyper"], lists=True)
    if problem:
        r.fail(f"optimizer {cls.__name__}: hyperparameter {problem}")
    params, idx = model.parameters(), o["params"]
    if (not isinstance(idx, list) or not idx or any(_count(i, len(params) - 1) is None for i in idx)
            or len(set(idx)) != len(idx)):
        r.fail(f"optimizer 'params' must be distinct indices into the model's {len(params)} parameters, "
               f"got {idx!r:.200}")
    groups = o.get("groups", [{"params": len(idx), **o["hyper"]}])
    if not isinstance(groups, list) or not 0 < len(groups) <= _MAX_GROUPS or any(
            not isinstance(g, dict) or _count(g.get("params"), len(idx)) is None for g in groups) or \
            sum(g["params"] for g in groups) != len(idx):
        r.fail(f"optimizer 'groups' must be a list of objects whose 'params' counts add up to {len(idx)}")
    for n, g in enumerate(groups):
        problem = _group_problem(g)
        if problem:
            r.fail(f"optimizer {cls.__name__}: parameter group {n}: {problem}")
    state = {}
    scalars = o["scalars"]
    if not isinstance(scalars, dict):
        r.fail("optimizer 'scalars' must be an object")
    for key, v in scalars.items():
        m = _STATE_KEY.fullmatch(key)
        if not m or int(m[1]) >= len(idx) or _count(v, _MAX_INT) is None:
            r.fail(f"optimizer scalar {key!r:.100} = {v!r:.50}: expected '<index>.<name>' (index below {len(idx)}) "
                   "= a non-negative integer")
        state.setdefault(int(m[1]), {})[m[2]] = v
    for name in r.table:
        if name.startswith("optimizer."):
            key = name[len("optimizer."):]
            m = _STATE_KEY.fullmatch(key)
            if not m or int(m[1]) >= len(idx):
                r.fail(f"tensor {name!r}: expected 'optimizer.<i>.<slot>' with i below {len(idx)}")
            state.setdefault(int(m[1]), {})[m[2]] = r.read(name, params[idx[int(m[1])]].shape)
    ours, made, sd, start = [params[i] for i in idx], [], {"state": state, "param_groups": []}, 0
    for g in groups:
        settings, n = {k: v for k, v in g.items() if k != "params"}, g["params"]
        sd["param_groups"].append({**settings, "params": list(range(start, start + n))})
        made.append({**settings, "params": ours[start:start + n]})
        start += n
    try:
        opt = cls(made, **o["hyper"])
    except (TypeError, ValueError, IndexError, KeyError) as e:
        r.fail(f"optimizer {cls.__name__}: {e}")
    sched = _build_scheduler(r, opt, r.header["scheduler"]) if "scheduler" in r.header else None
    try:
        opt.load_state_dict(sd)
    except (TypeError, ValueError, IndexError, KeyError) as e:
        r.fail(f"optimizer {cls.__name__}: {e}")
    if sched is not None:
        state = r.header["scheduler"]["state"]
        problem = _same_layout(sched.state_dict(), state, "state")
        if problem:
            r.fail(f"scheduler {type(sched).__name__}: {problem}")
        sched.load_state_dict(state)
    return opt, sched


def _group_problem(g):
    """What is wrong with a saved parameter group {"params": count, setting: value, ...}, or None:
    settings are short names with finite numbers, booleans, null, short strings (a group's name) or
    short lists of numbers (betas)."""
    if not isinstance(g, dict) or len(g) > 64:
        return "must be an object of at most 64 settings"
    for k, v in g.items():
        if not isinstance(k, str) or not _SETTING.fullmatch(k):
            return f"setting name {k!r:.70} is not a short identifier"
        for x in v if isinstance(v, list) and len(v) <= 8 else [v]:
            if not (x is None or isinstance(x, bool) or (isinstance(x, float) and math.isfinite(x))
                    or (isinstance(x, int) and abs(x) <= _MAX_INT) or (isinstance(x, str) and len(x) <= 64)):
                return f"{k!r} = {v!r:.100}: expected a finite number, boolean, null, a short string or a short " \
                       "list of numbers"
    return None


def _build_scheduler(r, opt, entry, depth=0):
    """A scheduler from its {"type", "config"} (a SequentialLR's schedulers within), made over opt."""
    fields = {"type", "config"} | ({"state"} if depth == 0 else set())
    if not isinstance(entry, dict) or set(entry) != fields:
        r.fail(f"header 'scheduler' entries must be objects with fields {sorted(fields)}")
    cls = lr_scheduler.SCHEDULERS.get(entry["type"]) if isinstance(entry["type"], str) else None
    if cls is None:
        r.fail(f"unknown scheduler type {entry['type']!r:.100}; expected one of {', '.join(lr_scheduler.SCHEDULERS)}")
    config = entry["config"]
    if cls is lr_scheduler.SequentialLR:
        if depth >= _MAX_SCHEDULER_DEPTH or not isinstance(config, dict) or \
                set(config) != {"schedulers", "milestones"} or not isinstance(config["schedulers"], list) or \
                not 0 < len(config["schedulers"]) <= 64:
            r.fail("a SequentialLR's config must be {'schedulers': [entries], 'milestones': [epochs]}, nested at "
                   f"most {_MAX_SCHEDULER_DEPTH} deep")
        config = {"milestones": config["milestones"],
                  "schedulers": [_build_scheduler(r, opt, e, depth + 1) for e in config["schedulers"]]}
    else:
        problem = _config_problem(cls, config, lists=_MAX_GROUPS)
        if problem:
            r.fail(f"scheduler {cls.__name__}: argument {problem}")
    try:
        return cls(opt, **config)
    except (TypeError, ValueError, KeyError, IndexError) as e:
        r.fail(f"scheduler {cls.__name__}: {e}")


def _same_layout(fresh, saved, where):
    """None if `saved` (a file's scheduler state) has the keys, lengths and kinds of values of `fresh`
    (the state of the scheduler rebuilt from its config), else what differs first."""
    if isinstance(fresh, dict):
        if not isinstance(saved, dict) or set(saved) != set(fresh):
            return f"{where} must have the fields {sorted(fresh)}"
        for k in fresh:
            problem = _same_layout(fresh[k], saved[k], f"{where}.{k}")
            if problem:
                return problem
        return None
    if isinstance(fresh, list):
        if not isinstance(saved, list) or len(saved) != len(fresh):
            return f"{where} must be a list of {len(fresh)} values"
        for n, (a, b) in enumerate(zip(fresh, saved)):
            problem = _same_layout(a, b, f"{where}[{n}]")
            if problem:
                return problem
        return None
    if isinstance(fresh, bool) or isinstance(fresh, str):
        ok = type(saved) is type(fresh) and (not isinstance(saved, str) or len(saved) <= 32)
    else:  # a number, or null where a number may come (a minimum learning rate per group, ...)
        ok = saved is None or (isinstance(saved, (int, float)) and not isinstance(saved, bool))
    return None if ok else f"{where} = {saved!r:.50}: expected a value like {fresh!r:.50}"


def _rng_from(r):
    s = r.header["rng"]
    name = s.get("bit_generator") if isinstance(s, dict) else None
    if name not in _RNG_TYPES:
        r.fail(f"header 'rng' must be a numpy bit-generator state of type {' or '.join(_RNG_TYPES)}, "
               f"got {name!r:.50}")
    bits = getattr(np.random, name)()
    try:
        bits.state = s
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        r.fail(f"header 'rng' is not a valid {name} state: {e!r}")
    return np.random.Generator(bits)


# ---------------------------------------------------------------------------------------
# helpers
def _config_problem(cls, config, lists=0):
    """What is wrong with `config` as keyword arguments of `cls` (None if nothing): keys must name
    the constructor's parameters and values be JSON numbers, booleans or null; a short string only
    where the parameter's default is a string (a mode such as Upsample's or GELU's approximate,
    which the constructor checks against its fixed set); optimizers and schedulers: also lists of at
    most `lists` numbers (True: 8; Adam's betas, a scheduler's value per group). A class's STR_ARGS
    names parameters that take a mode string besides numbers (Conv1d's padding="same"), its PAIR_ARGS
those that take a (height, width) pair of numbers as well (Conv2d's kernel_size, ...)."""
    if not isinstance(config, dict):
        return f"must be an object, got {type(config).__name__}"
    if hasattr(cls, "config_problem"):  # a config of structured values (a graph's nodes): its class checks it
        return cls.config_problem(config)
    sig = inspect.signature(cls)
    names = [n for n, p in sig.parameters.items()
             if n not in ("params", "optimizer") and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    longest = 8 if lists is True else int(lists)
    for k, v in config.items():
        if k not in names:
            return f"key {k!r:.100} is not an argument of {cls.__name__} (expected some of {names})"
        if isinstance(v, list) and len(v) <= longest or (isinstance(v, (list, tuple)) and len(v) == 2
                                                         and k in getattr(cls, "PAIR_ARGS", ())):
            vs = v
        else:
            vs = [v]
        for x in vs:
            if not (x is None or isinstance(x, bool) or (isinstance(x, float) and math.isfinite(x))
                    or (isinstance(x, int) and abs(x) <= _MAX_INT)
                    or (isinstance(x, str) and len(x) <= 32 and (isinstance(sig.parameters[k].default, str)
                                                                  or k in getattr(cls, "STR_ARGS", ())))):
                return f"{k!r} = {v!r:.100}: expected a finite number, boolean or null"
    return None


def _header_problem(raw):
    """Why the header bytes `raw` are too costly to parse (None if they are not), found in C-speed
    scans of the bytes before json.loads builds anything: a Python object per JSON value is what
    makes a small hostile header cost gigabytes ({"x": [[], [], ...]}). Brackets and commas inside
    strings count too, an overestimate the writer applies alike (save refuses what load would)."""
    if len(raw) > _MAX_HEADER:
        return f"has {len(raw)} bytes, more than the {_MAX_HEADER} any model needs"
    opening, closing = raw.count(b"[") + raw.count(b"{"), raw.count(b"]") + raw.count(b"}")
    values = opening + raw.count(b",")
    if values > _MAX_VALUES or closing > _MAX_VALUES:
        return f"holds {max(values, closing)} JSON values or brackets, more than the {_MAX_VALUES} any model needs"
    steps = _BRACKET[np.frombuffer(raw.translate(None, _NOT_BRACKETS), np.uint8)]  # at most 2 * _MAX_VALUES
    depth = int(np.cumsum(steps).max(initial=0))
    if depth > _MAX_NESTING:
        return f"nests {depth} levels deep, more than the {_MAX_NESTING} any model needs"
    return None


def _count(v, hi):
    """`v` if it is an int in [0, hi] (JSON booleans are not), else None."""
    return v if type(v) is int and 0 <= v <= hi else None


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _json_default(o):
    if isinstance(o, (np.integer, np.floating, np.bool_)):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not a JSON value")


def _version():
    return __version__


@contextlib.contextmanager
def _scratch_rng():
    saved = _module.rng()
    _module.set_rng(np.random.default_rng(0))
    try:
        yield
    finally:
        _module.set_rng(saved)
