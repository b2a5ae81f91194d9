""".netcl files and checkpoints: bit-exact round trips, exact resume, hostile and corrupt files,
atomic saves. Files are checked byte by byte: a malformed one must raise FormatError naming what
was expected, never run code, never allocate what the header claims before checking it."""
import hashlib
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import netcl
from netcl import FormatError, Tensor, nn, optim
from netcl.io import load, load_checkpoint, save, save_checkpoint
from netcl.io import netcl_format as fmt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def every_layer_cnn():
    # x: (N, 3, 8, 8) -> (N, 4); every layer type but MultiheadAttention
    return nn.Sequential(
        nn.Conv2d(3, 5, 3, padding=1), nn.BatchNorm2d(5, eps=1e-3, momentum=0.2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(5, 6, 3, stride=1, padding=1, bias=False), nn.LeakyReLU(0.2), nn.AvgPool2d(3, stride=2, padding=1),
        nn.Tanh(), nn.Flatten(), nn.Linear(6 * 2 * 2, 7), nn.Sigmoid(), nn.Dropout(0.25),
        nn.Identity(), nn.Linear(7, 4, bias=False), nn.Softmax(dim=1))


def attention_model():
    # x: (N, L, 6) -> (N, L, 3)
    return nn.Sequential(nn.Linear(6, 8), nn.MultiheadAttention(8, 2), nn.Tanh(), nn.Linear(8, 3), nn.Softmax(dim=-1))


def transposed_conv_model():
    # x: (N, 3, 5, 5) -> (N, 2, 10, 10); grouped and dilated convolutions: tests/test_conv_family.py;
    # (height, width) pairs and padding="same" (files hold the pairs as lists): tests/test_conv_tuples.py
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(4, 4, (2, 3), padding="same", dilation=(1, 2)), nn.MaxPool2d((3, 1), (1, 1), (1, 0)),
                         nn.ConvTranspose2d(4, 4, (1, 3), stride=(1, 2), padding=(0, 1), output_padding=(0, 1)),
                         nn.AvgPool2d((1, 2)),
                         nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1))


def blocks_model():
    # x: (N, 3, 8, 8) -> (N, 6, 8, 8); the blocks, nested, and Upsample
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.Residual(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), shortcut=nn.Identity()),
        nn.Concat(nn.Sequential(nn.MaxPool2d(2), nn.Upsample(2, "bilinear")),
                  nn.Residual(nn.Conv2d(4, 2, 1), shortcut=nn.Sequential(nn.Conv2d(4, 2, 1, bias=False),
                                                                       nn.BatchNorm2d(2)))))


def held(layer):
    """Every layer a model holds, blocks' children included."""
    for _, child in layer.named_children():
        yield child
        yield from held(child)


def modern_model():
    # x: (N, 3, 8, 8) -> (N, 5); the activations, norms and shape layers of modern architectures
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.GELU(approximate="tanh"), nn.AdaptiveAvgPool2d(4), nn.Hardswish(),
        nn.Flatten(2, 3), nn.Transpose(1, 2), nn.LayerNorm(6, eps=1e-3), nn.Linear(6, 7), nn.GELU(), nn.SiLU(),
        nn.ReLU6(), nn.Transpose(-1, -2), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Hardsigmoid(), nn.Linear(7, 5))


def tabular_model():
    # x: (N, 6) -> (N, 3); BatchNorm1d and the parameterised activations
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.PReLU(8, init=0.1), nn.ELU(0.5), nn.Softplus(2.0),
                         nn.Mish(), nn.Linear(8, 3), nn.LogSoftmax(1))


def embedding_model():
    # indices (N, 3) in [0, 10) -> (N, 5)
    return nn.Sequential(nn.Embedding(10, 4, padding_idx=0), nn.Flatten(), nn.Linear(12, 5))


def signal_model():
    # x: (N, 3, 16) -> (N, 4); the 1-D layers: Conv1d (padding="same", groups, dilation), MaxPool1d, AvgPool1d,
    # ConvTranspose1d, InstanceNorm1d
    return nn.Sequential(nn.Conv1d(3, 6, 5, stride=2, padding=2), nn.BatchNorm1d(6), nn.ReLU(),
                         nn.MaxPool1d(3, 1, 1), nn.Conv1d(6, 6, 4, padding="same", dilation=2, groups=3, bias=False),
                         nn.ConvTranspose1d(6, 6, 3, stride=2, padding=1, groups=2, dilation=2),
                         nn.InstanceNorm1d(6, affine=True), nn.AvgPool1d(2), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                         nn.Linear(6, 4))


def groupnorm_model():
    # x: (N, 4, 6, 6) -> (N, 3); GroupNorm with and without its affine parameters, and on (N, C, L);
    # InstanceNorm2d likewise
    return nn.Sequential(nn.Conv2d(4, 6, 3), nn.GroupNorm(3, 6), nn.ReLU(), nn.GroupNorm(6, 6, affine=False),
                         nn.InstanceNorm2d(6, affine=True), nn.InstanceNorm2d(6, eps=1e-3),
                         nn.Flatten(2), nn.GroupNorm(2, 6, eps=1e-3), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                         nn.Linear(6, 3))


def graph_model():
    # x: (N, 3, 8, 8) -> (N, 5); a traced graph (GraphModule, its ModuleDict containers) written by
    # hand, so that no device is needed: conv, relu, times a parameter of its own, plus a constant
    nodes = [{"op": "input", "out": [["N", 4, 8, 8]]},
             {"op": "call", "target": "enc.conv", "args": [{"v": 0}], "out": [["N", 4, 8, 8]]},
             {"op": "F.relu", "args": [{"v": 1}], "out": [["N", 4, 8, 8]]},
             {"op": "param", "target": "enc.gain", "out": [[4, 1, 1]]},
             {"op": "mul", "args": [{"v": 2}, {"v": 3}], "out": [["N", 4, 8, 8]]},
             {"op": "const", "target": "const_0", "out": [[8]]},
             {"op": "add", "args": [{"v": 4}, {"v": 5}], "out": [["N", 4, 8, 8]]},
             {"op": "flatten", "args": [{"v": 6}, 1, -1], "out": [["N", 256]]},
             {"op": "call", "target": "head", "args": [{"v": 7}], "out": [["N", 5]]},
             {"op": "output", "args": [{"v": 8}], "out": [["N", 5]]}]
    gain = nn.Parameter(np.linspace(0.5, 1.5, 4, dtype=np.float32).reshape(4, 1, 1))
    graph = nn.GraphModule(nodes, {"enc.conv": nn.Conv2d(4, 4, 3, padding=1), "head": nn.Linear(256, 5)},
                           {"enc.gain": gain}, {"const_0": np.arange(8, dtype=np.float32) / 8})
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), graph)


def rnn_model():
    # x: (N, 5, 3) -> (N, 3); LSTM and GRU in a traced graph written by hand: a bidirectional two-layer
    # LSTM's output sequence (its first of three values) into a GRU without bias, the last step out
    nodes = [{"op": "input", "out": [["N", 5, 4]]},
             {"op": "call", "target": "lstm", "args": [{"v": 0}], "out": [["N", 5, 12], [4, 2, 6], [4, 2, 6]]},
             {"op": "call", "target": "gru", "args": [{"v": 1, "k": 0}], "out": [["N", 5, 3], [1, 2, 3]]},
             {"op": "getitem", "args": [{"v": 2, "k": 0}, {"tuple": [{"slice": [None, None, None]}, -1]}],
              "out": [["N", 3]]},
             {"op": "output", "args": [{"v": 3}], "out": [["N", 3]]}]
    graph = nn.GraphModule(nodes, {"lstm": nn.LSTM(4, 6, num_layers=2, batch_first=True, bidirectional=True),
                                   "gru": nn.GRU(12, 3, batch_first=True, bias=False)}, {}, {})
    return nn.Sequential(nn.Linear(3, 4), graph)


def with_running_stats(model, rng):
    sd = model.state_dict()
    for k in sd:
        if k.endswith("running_mean"):
            sd[k] = rng.normal(size=sd[k].shape).astype(np.float32)
        elif k.endswith("running_var"):
            sd[k] = rng.uniform(0.5, 2.0, sd[k].shape).astype(np.float32)
    return model.load_state_dict(sd)


# ---------------------------------------------------------------------------------------
# round trips
@pytest.mark.parametrize("build, shape", [(every_layer_cnn, (2, 3, 8, 8)), (attention_model, (2, 5, 6)),
                                          (transposed_conv_model, (2, 3, 5, 5)), (blocks_model, (2, 3, 8, 8)),
                                          (modern_model, (2, 3, 8, 8)), (graph_model, (2, 3, 8, 8)),
                                          (tabular_model, (2, 6)), (embedding_model, (2, 3)),
                                          (signal_model, (2, 3, 16)), (groupnorm_model, (2, 4, 6, 6)),
                                          (rnn_model, (2, 5, 3))])
def test_round_trip_is_bit_exact(queue, rng, tmp_path, build, shape):
    model = with_running_stats(build(), rng)
    path = tmp_path / "m.netcl"
    save(model, path)
    loaded = load(str(path))
    assert isinstance(loaded, nn.Sequential) and loaded.training == model.training
    assert [(type(a), a.config()) for a in loaded] == [(type(b), b.config()) for b in model]
    want, got = model.state_dict(), loaded.state_dict()
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == np.float32 and np.array_equal(got[k], want[k]), k
    x = (rng.integers(0, 10, shape) if build is embedding_model else rng.normal(size=shape)).astype(np.float32)
    y0 = model.eval()(Tensor.from_host(queue, x)).to_host()
    y1 = loaded.eval()(Tensor.from_host(queue, x)).to_host()
    assert np.array_equal(y0, y1)
    save(loaded.train(), tmp_path / "again.netcl")  # the file is a pure function of the model
    assert (tmp_path / "again.netcl").read_bytes() == path.read_bytes()


def test_every_layer_type_is_covered_and_its_tensor_shapes_known():
    """The round-trip models hold every registered layer; each class's tensor_shapes (what the
    loader checks files against) names exactly the tensors a layer of that config holds."""
    layers = [m for build in (every_layer_cnn, attention_model, transposed_conv_model, blocks_model, modern_model,
                              graph_model, tabular_model, embedding_model, signal_model, groupnorm_model, rnn_model)
              for m in held(build())]
    assert {type(layer).__name__ for layer in layers} == set(nn.LAYERS)
    for layer in layers:
        own = {k: t.shape for k, t, owner, _ in layer._owned_tensors() if owner is layer}  # not its children's
        assert type(layer).tensor_shapes(**layer.config()) == own, type(layer).__name__


def test_file_layout(tmp_path):
    path = tmp_path / "m.netcl"
    save(attention_model().eval(), path)
    blob = path.read_bytes()
    version, header, data = split(blob)
    assert blob[:8] == fmt.MAGIC and version == fmt.FORMAT_VERSION
    assert (16 + struct.unpack_from("<I", blob, 12)[0]) % fmt.ALIGN == 0
    assert header["kind"] == "model" and header["training"] is False
    assert header["architecture"][1] == {"type": "MultiheadAttention", "config": {"embed_dim": 8, "num_heads": 2}}
    for e in header["tensors"]:
        assert e["dtype"] == "float32" and e["offset"] % fmt.ALIGN == 0
        assert e["nbytes"] == 4 * int(np.prod(e["shape"]))
    assert blob[-32:] == hashlib.sha256(blob[:-32]).digest()


def test_load_needs_no_pyopencl(tmp_path):
    path = tmp_path / "m.netcl"
    save(every_layer_cnn(), path)
    code = ("import sys; sys.modules['pyopencl'] = None\n"  # any import of pyopencl now fails
            "from netcl.io import load, save\n"
            f"m = load({str(path)!r}); save(m, {str(tmp_path / 'copy.netcl')!r}); print(len(m))")
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "15"
    assert (tmp_path / "copy.netcl").read_bytes() == path.read_bytes()


def test_load_leaves_the_random_stream_alone(tmp_path):
    save(every_layer_cnn(), tmp_path / "m.netcl")
    netcl.manual_seed(7)
    want = nn.module.rng().integers(0, 2**32, 4)
    netcl.manual_seed(7)
    load(tmp_path / "m.netcl")
    assert np.array_equal(nn.module.rng().integers(0, 2**32, 4), want)


# ---------------------------------------------------------------------------------------
# checkpoints
@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images[:192] / 16.0).astype(np.float32)[:, None]  # (192, 1, 8, 8)
    return x, d.target[:192]


def digits_net():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Dropout(0.3), nn.Linear(64, 10))


OPTIMIZERS = {"sgd_momentum": lambda p: optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4),
              "adam": lambda p: optim.Adam(p, lr=3e-3, betas=(0.8, 0.99))}


def train(queue, model, opt, data, steps, start):
    x, y = data
    loss_fn, losses = nn.CrossEntropyLoss(), []
    for s in range(start, start + steps):
        i = (s * 32) % len(x)
        losses.append(loss_fn(model(Tensor.from_host(queue, x[i:i + 32])), y[i:i + 32]))
        model.backward(loss_fn.backward())
        opt.step()
        opt.zero_grad()
    return losses


@pytest.mark.parametrize("which", sorted(OPTIMIZERS))
def test_resume_matches_the_straight_run(queue, digits, tmp_path, which):
    k = 8
    netcl.manual_seed(3)
    model = digits_net()
    straight = train(queue, model, OPTIMIZERS[which](model.parameters()), digits, k, 0)
    final = model.state_dict()

    netcl.manual_seed(3)
    model = digits_net()
    opt = OPTIMIZERS[which](model.parameters())
    first = train(queue, model, opt, digits, k // 2, 0)
    save_checkpoint(tmp_path / "ckpt.netcl", model, opt, epoch=3, note="half way", best=[1.5, None])
    hyper = opt.hyperparameters()
    del model, opt
    netcl.manual_seed(12345)  # whatever happens in between, the checkpoint restores the generator

    model, opt, meta = load_checkpoint(tmp_path / "ckpt.netcl")
    assert meta == {"epoch": 3, "note": "half way", "best": [1.5, None]}
    assert type(opt) is {"sgd_momentum": optim.SGD, "adam": optim.Adam}[which]
    assert opt.hyperparameters() == hyper and model.training
    assert all(a is b for a, b in zip(opt.params, model.parameters()))
    second = train(queue, model, opt, digits, k - k // 2, k // 2)
    assert first + second == straight  # the same floats, not merely close
    for name, a in model.state_dict().items():
        assert np.array_equal(a, final[name]), name


def digits_loop(model, loss_fn, opt, sched, loader, epochs):
    """Epochs of a training loop with the loop's parts: a DataLoader, gradient clipping, a scheduler
    stepped per batch (OneCycleLR) or per epoch (ReduceLROnPlateau on the epoch's mean loss)."""
    losses = []
    for _ in range(epochs):
        epoch = []
        for xb, yb in loader:
            loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            epoch.append(float(loss))
            if isinstance(sched, optim.lr_scheduler.OneCycleLR):
                sched.step()
        if isinstance(sched, optim.lr_scheduler.ReduceLROnPlateau):
            sched.step(np.mean(epoch))
        elif not isinstance(sched, optim.lr_scheduler.OneCycleLR):
            sched.step()
        losses += epoch
    return losses


RESUMED = {  # name -> make(optimizer) of the scheduler
    "OneCycleLR": lambda o: optim.lr_scheduler.OneCycleLR(o, max_lr=[0.02, 0.05], total_steps=4 * 12),
    "SequentialLR": lambda o: optim.lr_scheduler.SequentialLR(
        o, [optim.lr_scheduler.LinearLR(o, 0.2, total_iters=2), optim.lr_scheduler.CosineAnnealingLR(o, 3)], [2]),
    "ReduceLROnPlateau": lambda o: optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=0),
}


@pytest.mark.parametrize("which", sorted(RESUMED))
def test_resume_with_groups_a_scheduler_and_a_loader_continues_exactly(queue, digits, tmp_path, which):
    """AdamW with two parameter groups (amsgrad in one), a scheduler, a shuffling DataLoader, clipping,
    Dropout: two epochs, a checkpoint, two more; against loading the checkpoint and running the last
    two: the same losses and weights, bit for bit (the scheduler comes back in meta)."""
    from netcl.data import DataLoader, TensorDataset

    def setup():
        netcl.manual_seed(11)
        model = digits_net().to(queue).train()
        ps = model.parameters()
        opt = optim.AdamW([{"params": ps[:4], "lr": 3e-3}, {"params": ps[4:], "amsgrad": True}], lr=1e-2)
        return model, opt, RESUMED[which](opt)

    def loader():
        return DataLoader(TensorDataset(*digits), batch_size=16, shuffle=True, drop_last=True, queue=queue)

    model, opt, sched = setup()
    straight = digits_loop(model, nn.CrossEntropyLoss(), opt, sched, loader(), 4)
    final, lrs = model.state_dict(), sched.get_last_lr()

    model, opt, sched = setup()
    first = digits_loop(model, nn.CrossEntropyLoss(), opt, sched, loader(), 2)
    save_checkpoint(tmp_path / "c.netcl", model, opt, epoch=2, scheduler=sched)
    del model, opt, sched
    netcl.manual_seed(999)
    model, opt, meta = load_checkpoint(tmp_path / "c.netcl")
    sched = meta.pop("scheduler")
    assert type(sched).__name__ == which and sched.optimizer is opt and meta == {"epoch": 2}
    assert [len(g["params"]) for g in opt.param_groups] == [4, 2] and opt.param_groups[1]["amsgrad"]
    second = digits_loop(model.to(queue), nn.CrossEntropyLoss(), opt, sched, loader(), 2)
    assert first + second == straight and sched.get_last_lr() == lrs
    for name, a in model.state_dict().items():
        assert np.array_equal(a, final[name]), name


def test_checkpoint_keeps_parameter_groups_and_their_settings(tmp_path):
    """Groups over some of the parameters in another order, a group's own settings, a name, a
    scheduler's keys: all back as they were (a file's groups partition the optimizer's parameters)."""
    model = digits_net()
    ps = model.parameters()
    opt = optim.SGD([{"params": [ps[4], ps[0]], "name": "head", "lr": 0.5}, {"params": ps[2:4], "nesterov": True}],
                    lr=0.1, momentum=0.9)
    optim.lr_scheduler.StepLR(opt, 3)
    save_checkpoint(tmp_path / "c.netcl", model, opt)
    loaded, back, _ = load_checkpoint(tmp_path / "c.netcl")
    lp = loaded.parameters()
    assert [[id(p) for p in g["params"]] for g in back.param_groups] == [[id(lp[4]), id(lp[0])], [id(lp[2]), id(lp[3])]]
    strip = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    assert [{k: v for k, v in g.items() if k != "params"} for g in back.param_groups] == strip
    assert strip[0]["name"] == "head" and strip[1]["initial_lr"] == 0.1 and back.hyperparameters() == \
        opt.hyperparameters()


def test_checkpoint_of_an_optimizer_over_some_parameters(tmp_path):
    model = digits_net()
    save_checkpoint(tmp_path / "c.netcl", model, optim.SGD(model.parameters()[2:], lr=0.1))
    loaded, opt, meta = load_checkpoint(tmp_path / "c.netcl")
    assert meta == {"epoch": None}
    assert [id(p) for p in opt.params] == [id(p) for p in loaded.parameters()[2:]]
    assert load(tmp_path / "c.netcl").state_dict().keys() == model.state_dict().keys()


# ---------------------------------------------------------------------------------------
# corrupt and hostile files
def split(blob):
    """(version, header dict, data bytes) of a well-formed file."""
    _, version, hlen = struct.unpack_from("<8sII", blob)
    return version, json.loads(blob[16:16 + hlen]), blob[16 + hlen:-32]


def assemble(header, data, version=fmt.FORMAT_VERSION):
    """A file with a correct checksum: what a deliberate attacker would write."""
    text = json.dumps(header).encode()
    text += b" " * (-(16 + len(text)) % 64)
    body = struct.pack("<8sII", fmt.MAGIC, version, len(text)) + text + data
    return body + hashlib.sha256(body).digest()


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """The bytes of a small model file and of a checkpoint with optimizer slots."""
    netcl.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    opt = optim.Adam(model.parameters())
    for st, p in zip(opt.state, opt.params):  # slots as after a step, without needing a device
        st.update(step=1, exp_avg=Tensor.from_host(None, np.ones(p.shape)),
                                              exp_avg_sq=Tensor.from_host(None, np.ones(p.shape)))
    sched = optim.lr_scheduler.SequentialLR(opt, [optim.lr_scheduler.LinearLR(opt, total_iters=2),
                                                  optim.lr_scheduler.CosineAnnealingLR(opt, T_max=3)], [2])
    d = tmp_path_factory.mktemp("good")
    save(model, d / "m.netcl")
    save_checkpoint(d / "c.netcl", model, opt, epoch=1, scheduler=sched)
    return (d / "m.netcl").read_bytes(), (d / "c.netcl").read_bytes()


def flip(blob, i):
    return blob[:i] + bytes([blob[i] ^ 0x01]) + blob[i + 1:]


def edited(blob, edit):
    version, header, data = split(blob)
    edit(header)
    return assemble(header, data, version)


def header_at(blob, text):
    return blob.index(text.encode())


def table(h, name):
    return next(e for e in h["tensors"] if e["name"] == name)


def setitem(d, k, v):
    d[k] = v


def _nested(depth):
    entry = {"type": "ReLU", "config": {}}
    for _ in range(depth):
        entry = {"type": "Sequential", "config": {}, "children": [["0", entry]]}
    return entry


CORRUPT = {  # name -> (make bad bytes from the model file, expected message)
    "empty": (lambda b: b"", "it is empty"),
    "cut in preamble": (lambda b: b[:5], "only 5 bytes"),
    "cut in header": (lambda b: b[:40], "header length"),
    "cut in data": (lambda b: b[:len(b) - 60], "truncated"),
    "cut in checksum": (lambda b: b[:-1], "truncated"),
    "trailing bytes": (lambda b: b + b"\0", "unexpected bytes after the checksum"),
    "wrong magic": (lambda b: b"\x89NETCX" + b[6:], "expected magic"),
    "future version": (lambda b: b[:8] + struct.pack("<I", 2) + b[12:], "format version 2 is not supported"),
    "version zero": (lambda b: b[:8] + struct.pack("<I", 0) + b[12:], "format version 0"),
    "huge header length": (lambda b: b[:12] + struct.pack("<I", 2**32 - 1) + b[16:], "header length 4294967295"),
    "flipped header byte": (lambda b: flip(b, header_at(b, '"netcl_version"') + 20), "checksum mismatch"),
    "header not JSON": (lambda b: flip(b, 16), "not valid UTF-8 JSON"),
    "flipped data byte": (lambda b: flip(b, len(b) - 40), "checksum mismatch"),
    "pickle": (lambda b: pickle.dumps({"0.weight": np.zeros(3)}), "pickle"),
    "text": (lambda b: b"hello, this is not a model\n", "expected magic"),
    # well-formed checksums around hostile headers
    "deeply nested header": (lambda b: assemble_raw(b"[" * 100000), "nests 100000 levels deep"),
    "header of many values": (lambda b: assemble_raw(b'{"x": [' + b"[]," * 300000 + b"[]]}"), "JSON values"),
    "header longer than any model's": (lambda b: b[:12] + struct.pack("<I", 9 << 20) + b[16:], "any model needs"),
    "kind a list": (lambda b: edited(b, lambda h: setitem(h, "kind", ["model"])), "'kind' must be"),
    "kind an object": (lambda b: edited(b, lambda h: setitem(h, "kind", {"model": 1})), "'kind' must be"),
    "header a list": (lambda b: assemble_raw(b"[1, 2]"), "must be a JSON object"),
    "unknown header field": (lambda b: edited(b, lambda h: setitem(h, "exec", "rm -rf /")), "unexpected ['exec']"),
    "huge data_bytes": (lambda b: edited(b, lambda h: setitem(h, "data_bytes", 2**50)), "truncated"),
    "huge tensor": (lambda b: edited(b, lambda h: table(h, "0.weight").update(shape=[2**40, 2**10], nbytes=2**52)),
                    "inside the"),
    "nbytes not shape": (lambda b: edited(b, lambda h: table(h, "0.weight").update(nbytes=8)), "does not match"),
    "offset out of range": (lambda b: edited(b, lambda h: table(h, "0.bias").update(offset=1 << 20)), "inside the"),
    "negative offset": (lambda b: edited(b, lambda h: table(h, "0.bias").update(offset=-64)), "inside the"),
    "misaligned offset": (lambda b: edited(b, lambda h: table(h, "0.bias").update(offset=68)), "64-aligned"),
    "overlapping tensors": (lambda b: edited(b, lambda h: table(h, "0.bias").update(offset=0)), "overlap"),
    "float64 tensor": (lambda b: edited(b, lambda h: table(h, "0.bias").update(dtype="float64")), "dtype"),
    "negative dimension": (lambda b: edited(b, lambda h: table(h, "0.bias").update(shape=[-3])), "non-negative"),
    "bool dimension": (lambda b: edited(b, lambda h: table(h, "0.bias").update(shape=[True, 3])), "non-negative"),
    "duplicate tensor": (lambda b: edited(b, lambda h: h["tensors"].append(dict(h["tensors"][0]))), "unique"),
    "wrong shape": (lambda b: edited(b, lambda h: table(h, "0.weight").update(shape=[3, 4])), "architecture needs"),
    "missing tensor": (lambda b: edited(b, lambda h: table(h, "2.bias").update(name="2.bia")),
                       "missing tensor '2.bias'"),
    "fewer elements than the config": (lambda b: edited(b, lambda h: h["tensors"].pop()),
                                       "missing tensor '2.bias'"),
    "unused tensor": (lambda b: edited(b, lambda h: h["tensors"].append(
        {"name": "junk", "shape": [0], "dtype": "float32", "offset": 0, "nbytes": 0})), "does not use"),
    "unknown layer": (lambda b: edited(b, lambda h: h["architecture"][1].update(type="os.system")),
                      "unknown layer type"),
    "children on a leaf layer": (lambda b: edited(b, lambda h: h["architecture"][1].update(
        children=[["0", {"type": "ReLU", "config": {}}]])), "holds no layers"),
    "nesting too deep": (lambda b: edited(b, lambda h: h["architecture"].append(_nested(33))), "levels of nesting"),
    "children not pairs": (lambda b: edited(b, lambda h: h["architecture"][1].update(type="Sequential",
                                                                                    children={"0": 1})),
                           "distinct [name, layer] pairs"),
    "code in config key": (lambda b: edited(b, lambda h: h["architecture"][0]["config"].update(
        __class__={"__init__": "os.system('echo pwned')"})), "'__class__' is not an argument of Linear"),
    "string config value": (lambda b: edited(b, lambda h: h["architecture"][0]["config"].update(
        in_features="__import__('os')")), "expected a finite number"),
    "config allocates more than the file holds": (lambda b: edited(b, lambda h: h["architecture"][0]["config"].update(
        in_features=10**9, out_features=10**9)), "the architecture needs (1000000000, 1000000000"),
    "invalid config value": (lambda b: edited(b, lambda h: h["architecture"][1].update(
        type="LeakyReLU", config={"negative_slope": None})), "invalid config"),
    # configs no constructor accepts: the loader applies the constructors' own rules
    "bias not a bool": (lambda b: edited(b, lambda h: h["architecture"][0]["config"].update(bias=-8)),
                        "bias must be a bool"),
    "probability a bool": (lambda b: edited(b, lambda h: h["architecture"].__setitem__(1, {
        "type": "Dropout", "config": {"p": True}})), "p must be a number"),
    "dim a bool": (lambda b: edited(b, lambda h: h["architecture"].__setitem__(1, {
        "type": "Softmax", "config": {"dim": True}})), "dim must be an int"),
    "stride 2**53": (lambda b: edited(b, lambda h: h["architecture"].__setitem__(1, {
        "type": "MaxPool2d", "config": {"kernel_size": 2, "stride": 2**53}})), "stride must be between 1 and"),
    "mode string outside the fixed set": (lambda b: edited(b, lambda h: h["architecture"][1].update(
        type="GELU", config={"approximate": "erf"})), "approximate must be one of ['none', 'tanh']"),
    "long mode string": (lambda b: edited(b, lambda h: h["architecture"][1].update(
        type="GELU", config={"approximate": "tanh" * 20})), "expected a finite number"),
    "string for a numeric argument": (lambda b: edited(b, lambda h: h["architecture"][1].update(
        type="LeakyReLU", config={"negative_slope": "0.1"})), "expected a finite number"),
    "extra layer entry field": (lambda b: edited(b, lambda h: h["architecture"][1].update(code="x")), "fields 'type'"),
}


def assemble_raw(text):
    text += b" " * (-(16 + len(text)) % 64)
    body = struct.pack("<8sII", fmt.MAGIC, 1, len(text)) + text
    return body + hashlib.sha256(body).digest()


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_model_file_raises_format_error(good, tmp_path, case):
    make, message = CORRUPT[case]
    path = tmp_path / "bad.netcl"
    path.write_bytes(make(good[0]))
    with pytest.raises(FormatError, match=message.replace("[", r"\[").replace("(", r"\(")) as e:
        load(path)
    assert str(path) in str(e.value) and isinstance(e.value, ValueError)


def optimizer(h):
    return h["optimizer"]


CORRUPT_CHECKPOINT = {
    "unknown optimizer": (lambda h: optimizer(h).update(type="Evil"), "unknown optimizer type 'Evil'"),
    "optimizer hyper injection": (lambda h: optimizer(h)["hyper"].update(__init__="x"), "'__init__' is not an arg"),
    "bad hyper value": (lambda h: optimizer(h)["hyper"].update(lr=-1.0), "lr must be in"),
    "non-finite hyper value": (lambda h: optimizer(h)["hyper"].update(lr=float("nan")), "expected a finite number"),
    "short betas": (lambda h: optimizer(h)["hyper"].update(betas=[0.9]), "pair"),
    "params out of range": (lambda h: optimizer(h).update(params=[0, 1, 2, 99]), "distinct indices"),
    "params repeated": (lambda h: optimizer(h).update(params=[0, 0, 1, 2]), "distinct indices"),
    "bad step": (lambda h: optimizer(h)["scalars"].update({"0.step": "1; rm"}), "non-negative integer"),
    "bad state key": (lambda h: optimizer(h)["scalars"].update({"__class__": 1}), "'<index>.<name>'"),
    "slot of a missing parameter": (lambda h: table(h, "optimizer.0.exp_avg").update(name="optimizer.9.exp_avg"),
                                    "with i below 4"),
    "slot shape": (lambda h: table(h, "optimizer.1.exp_avg").update(shape=[1, 3], nbytes=12),
                   "the architecture needs"),
    "rng type": (lambda h: h["rng"].update(bit_generator="MT19937"), "bit-generator state"),
    "rng state": (lambda h: h["rng"].update(state="x"), "not a valid PCG64 state"),
    "meta not an object": (lambda h: h.update(meta=[1]), "'meta' must be an object"),
    "epoch not an int": (lambda h: h["meta"].update(epoch="3"), "'epoch' must be an integer"),
    "missing optimizer": (lambda h: h.pop("optimizer"), "missing ['optimizer']"),
}


def group(h, i=0):
    return h["optimizer"]["groups"][i]


def scheduler(h):
    return h["scheduler"]


CORRUPT_CHECKPOINT.update({
    "group counts": (lambda h: group(h).update(params=3), "add up to 4"),
    "group setting name": (lambda h: group(h).update(__class__=1.0), "not a short identifier"),
    "group setting value": (lambda h: group(h).update(initial_lr=[[1]]), "expected a finite number"),
    "group setting string": (lambda h: group(h).update(lr="0.1"), "lr must be a number"),
    "group bad lr": (lambda h: group(h).update(lr=-1.0), "lr must be in"),
    "group not an object": (lambda h: h["optimizer"]["groups"].append(1), "'params' counts"),
    "unknown scheduler": (lambda h: scheduler(h).update(type="Evil"), "unknown scheduler type 'Evil'"),
    "scheduler argument injection": (lambda h: scheduler(h)["config"]["schedulers"][0]["config"].update(
        __init__=1), "'__init__' is not an argument"),
    "scheduler argument value": (lambda h: scheduler(h)["config"]["schedulers"][1]["config"].update(T_max=0),
                                 "T_max must be in"),
    "scheduler nested state": (lambda h: scheduler(h)["config"].update(schedulers=[]), "SequentialLR's config"),
    "scheduler state field": (lambda h: scheduler(h)["state"].update(evil=1), "must have the fields"),
    "scheduler state kind": (lambda h: scheduler(h)["state"]["_schedulers"][1].update(T_max="3"),
                             "expected a value like"),
    "scheduler state length": (lambda h: scheduler(h)["state"]["_last_lr"].append(0.1), "list of 1 values"),
})


@pytest.mark.parametrize("case", sorted(CORRUPT_CHECKPOINT))
def test_corrupt_checkpoint_raises_format_error(good, tmp_path, case):
    edit, message = CORRUPT_CHECKPOINT[case]
    path = tmp_path / "bad.netcl"
    path.write_bytes(edited(good[1], edit))
    netcl.manual_seed(5)
    want = nn.module.rng().bit_generator.state
    with pytest.raises(FormatError, match=message.replace("[", r"\[")):
        load_checkpoint(path)
    assert nn.module.rng().bit_generator.state == want  # a failed load leaves the generator alone


def test_the_unedited_files_load(good, tmp_path):
    """The corrupt-file cases above fail because of their edits, not the base files."""
    for i, blob in enumerate(good):
        (tmp_path / f"{i}.netcl").write_bytes(edited(blob, lambda h: None))
        assert len(load(tmp_path / f"{i}.netcl")) == 3
    model, opt, meta = load_checkpoint(tmp_path / "1.netcl")
    sched = meta.pop("scheduler")
    assert isinstance(opt, optim.Adam) and meta == {"epoch": 1} and opt.state[3]["step"] == 1
    assert isinstance(sched, optim.lr_scheduler.SequentialLR) and sched.optimizer is opt


def test_model_file_is_not_a_checkpoint(good, tmp_path):
    (tmp_path / "m.netcl").write_bytes(good[0])
    with pytest.raises(FormatError, match="without optimizer state"):
        load_checkpoint(tmp_path / "m.netcl")


# ---------------------------------------------------------------------------------------
# atomic saves and bad arguments
def only_file(folder):
    return sorted(os.listdir(folder))


def test_failed_save_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "m.netcl"
    save(every_layer_cnn(), path)
    before = path.read_bytes()
    calls = []

    def dies_midway(self):
        calls.append(1)
        if len(calls) == 3:  # two tensors already on disk
            raise OSError("disk on fire")
        return real(self)

    real = Tensor.numpy
    monkeypatch.setattr(Tensor, "numpy", dies_midway)
    with pytest.raises(OSError, match="disk on fire"):
        save(every_layer_cnn(), path)
    monkeypatch.undo()
    assert path.read_bytes() == before and only_file(tmp_path) == ["m.netcl"]

    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("rename failed")))
    with pytest.raises(OSError, match="rename failed"):
        save(every_layer_cnn(), path)
    monkeypatch.undo()
    assert path.read_bytes() == before and only_file(tmp_path) == ["m.netcl"]


def test_model_with_a_bad_tensor_is_not_saved(tmp_path):
    path = tmp_path / "m.netcl"
    save(every_layer_cnn(), path)
    before = path.read_bytes()
    model = every_layer_cnn()
    with pytest.raises(ValueError, match="host data has 5 elements"):  # data that disagrees with its shape
        Tensor((7,), None, None, np.zeros(5, np.float32))
    model[9]._params["bias"] = np.zeros(7, np.float32)
    with pytest.raises(TypeError, match="'9.bias' is a ndarray"):
        save(model, path)
    assert path.read_bytes() == before and only_file(tmp_path) == ["m.netcl"]


def test_bad_arguments(tmp_path):
    model = digits_net()
    opt = optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save(model, tmp_path / "no" / "such" / "m.netcl")
    with pytest.raises(IsADirectoryError):
        save(model, tmp_path)
    with pytest.raises(TypeError, match="Sequential"):
        save(model[0], tmp_path / "m.netcl")
    with pytest.raises(TypeError, match="path must be"):
        save(model, 42)
    with pytest.raises(TypeError, match="optimizer"):
        save_checkpoint(tmp_path / "c.netcl", model, "sgd")
    with pytest.raises(ValueError, match="not parameters of the model"):
        save_checkpoint(tmp_path / "c.netcl", model, optim.SGD(digits_net().parameters(), lr=0.1))
    with pytest.raises(TypeError, match="epoch"):
        save_checkpoint(tmp_path / "c.netcl", model, opt, epoch="3")
    with pytest.raises(TypeError, match="JSON"):
        save_checkpoint(tmp_path / "c.netcl", model, opt, callback=print)

    class Custom(nn.ReLU):
        pass

    with pytest.raises(ValueError, match="not a netcl layer type"):
        save(nn.Sequential(Custom()), tmp_path / "m.netcl")
    assert only_file(tmp_path) == []
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.netcl")


_SAVER = """
import sys
import netcl
from netcl import nn
from netcl.io import save
netcl.manual_seed(1)
model = nn.Sequential(nn.Linear(2500, 2500), nn.ReLU(), nn.Linear(2500, 10))  # a 25 MB file
while True:
    save(model, sys.argv[1])
"""


def _size(p):
    try:
        return p.stat().st_size
    except FileNotFoundError:  # renamed into place meanwhile
        return 0


def test_a_save_killed_midway_leaves_the_old_file_and_the_next_save_cleans_up(tmp_path):
    """SIGKILL (no handler runs, no cleanup) while a large model is being written over an existing
    file: the old file still loads identically, and the next save removes the dead writer's
    temporary file."""
    path = tmp_path / "m.netcl"
    netcl.manual_seed(0)
    old = nn.Sequential(nn.Linear(2500, 2500), nn.ReLU(), nn.Linear(2500, 10))
    save(old, path)
    before = path.read_bytes()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", _SAVER, str(path)], env=env)
        try:
            deadline = time.monotonic() + 60
            while True:  # until its temporary file holds a megabyte: the kill lands mid-write
                last = list(tmp_path.glob(f".m.netcl.{child.pid}-*.tmp"))
                if last and _size(last[0]) > 1 << 20:
                    break
                assert time.monotonic() < deadline and child.poll() is None, "the saver never started writing"
                time.sleep(0.002)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        assert path.read_bytes() == before
    # each saver's first save removed the killed one's half-written file: the last one's is left
    assert [p.name for p in tmp_path.glob(".m.netcl.*.tmp")] == [p.name for p in last]
    loaded = load(path)
    assert all(np.array_equal(a, loaded.state_dict()[k]) for k, a in old.state_dict().items())
    save(loaded, path)
    assert only_file(tmp_path) == ["m.netcl"] and path.read_bytes() == before


_BOMB_LOADER = """
import resource, sys, time
from netcl import FormatError
from netcl.io import load
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
try:
    load(sys.argv[1])
except FormatError as e:
    print(time.perf_counter() - t, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024, e)
"""


@pytest.mark.parametrize("text, message", [
    (b'{"x":[' + b"[]," * (21 << 20) + b"[]]}", "any model needs"),  # 63 MiB: 12 s and 1.4 GB before the cap
    (b'{"x":[' + b"[]," * (2 << 20) + b"[]]}", "JSON values"),  # 6 MiB, under the length cap: 0.7 s, 180 MB
    (b'{"x":' + b"[" * (6 << 20) + b"]" * (1 << 20) + b"}", "JSON values or brackets"),
    (b'{"x":' + b"[" * 200000 + b"]" * 200000 + b"}", "nests 200001 levels deep"),
    (b'{"x":' + b"]" * (1 << 20) + b"}", "JSON values or brackets"),
])
def test_a_header_bomb_is_refused_in_little_time_and_memory(tmp_path, text, message):
    path = tmp_path / "bomb.netcl"
    path.write_bytes(assemble_raw(text))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", _BOMB_LOADER, str(path)], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    seconds, megabytes, error = out.split(" ", 2)
    assert message in error
    assert float(seconds) < 2.0 and float(megabytes) < 100, out  # measured: 0.04 s, 6 MB at most


def test_save_refuses_a_header_that_load_would_refuse_and_keeps_what_it_accepts(tmp_path):
    model = nn.Sequential(nn.Linear(2, 2))
    opt = optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="cannot save .* JSON values"):
        save_checkpoint(tmp_path / "c.netcl", model, opt, epoch=0, history=list(range(600000)))
    with pytest.raises(ValueError, match="cannot save .* nests"):
        save_checkpoint(tmp_path / "c.netcl", model, opt, epoch=0, deep=json.loads("[" * 150 + "]" * 150))
    assert only_file(tmp_path) == []
    deepest = nn.ReLU()  # blocks nested as deep as the reader allows (32 levels) load back
    for _ in range(fmt._MAX_DEPTH - 1):
        deepest = nn.Sequential(deepest)
    save(nn.Sequential(nn.Linear(2, 2), deepest), tmp_path / "m.netcl")
    assert type(load(tmp_path / "m.netcl")[1]) is nn.Sequential
