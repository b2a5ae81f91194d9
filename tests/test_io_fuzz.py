"""A seeded fuzz test of the .netcl reader: thousands of mutants of valid model and checkpoint
files (byte flips, truncations, and header mutations with the checksum recomputed, so that the
header parser and every check behind it are reached). Every outcome must be a clean load or a
FormatError: never another exception, a crash, a hang or an allocation the file does not back."""
import copy
import hashlib
import json
import random
import struct

import numpy as np
import pytest

import netcl
from netcl import FormatError, Tensor, nn, optim
from test_io import graph_model
from netcl.io import load, load_checkpoint, save, save_checkpoint
from netcl.io import netcl_format as fmt

SEED, BYTE_FLIPS, TRUNCATIONS, TREE_EDITS, TEXT_EDITS = 20240612, 500, 300, 2400, 800

# values a hostile or damaged header might hold where the reader expects something else
ODD = [None, True, False, 0, -1, 1, 3, 7, 64, 2**31, 2**53, 2**64, -2**63, 0.5, -0.0, 1e308, float("nan"),
       float("inf"), "", "x", "0.weight", "float32", "model", "checkpoint", "ReLU", "Sequential", "Conv2d",
       [], {}, [[]], [1, 2], ["0", {}], {"type": "ReLU", "config": {}}, {"a": 1}, [True], [2**40, 2**40]]


def model():
    # every kind of entry: conv, norm, pools, nested blocks, attention, dropout, a bias-free linear
    netcl.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(2, 3, 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(3), nn.LeakyReLU(0.1))
    return nn.Sequential(block, nn.MaxPool2d(2), nn.AvgPool2d(3, stride=1, padding=1), nn.Flatten(),
                         nn.Linear(12, 8), nn.Dropout(0.25), nn.Sequential(nn.Identity(), nn.Tanh()),
                         nn.Linear(8, 6, bias=False), nn.Sigmoid(), nn.Softmax(dim=-1))


def attention():
    netcl.manual_seed(1)
    return nn.Sequential(nn.Linear(3, 4), nn.MultiheadAttention(4, 2), nn.ReLU())


def checkpoint(path, m, opt_cls, **hyper):
    opt = opt_cls(m.parameters(), **hyper)
    for st, p in zip(opt.state, opt.params):  # slots as after a step, without a device
        st.update(step=3, **{s: Tensor.from_host(None, np.ones(p.shape)) for s in opt.slots})
    save_checkpoint(path, m, opt, epoch=2, note="fuzz", tags=["a", "b"])


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    save(model(), d / "m.netcl")
    save(attention().eval(), d / "a.netcl")
    save(graph_model().layers[1], d / "g.netcl")  # a GraphModule as the root (header "root": "layer")
    save(graph_model(), d / "gs.netcl")  # and inside a Sequential
    checkpoint(d / "adam.netcl", model(), optim.Adam, betas=(0.8, 0.99))
    checkpoint(d / "sgd.netcl", attention(), optim.SGD, lr=0.1, momentum=0.9, nesterov=True)
    return [(d / n).read_bytes() for n in ("m.netcl", "a.netcl", "g.netcl", "gs.netcl", "adam.netcl", "sgd.netcl")]


def split(blob):
    _, version, hlen = struct.unpack_from("<8sII", blob)
    return version, blob[16:16 + hlen], blob[16 + hlen:-32]


def assemble(text, data, version=fmt.FORMAT_VERSION):
    """A file around header `text` with a correct checksum: what a deliberate attacker writes."""
    text += b" " * (-(16 + len(text)) % 64)
    body = struct.pack("<8sII", fmt.MAGIC, version, len(text)) + text + data
    return body + hashlib.sha256(body).digest()


def nodes(tree, path=()):
    """(path, value) of every node of a JSON tree."""
    yield path, tree
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        yield from nodes(v, path + (k,))


def edit_tree(header, r):
    """One structural edit of the parsed header: replace a node (by an odd value or another node),
    drop or add a key, or drop or repeat a list element. Returns (new header, a description)."""
    h = copy.deepcopy(header)
    if not isinstance(h, dict) or not h:
        return r.choice(ODD), "the whole header replaced"
    path, _ = r.choice(list(nodes(h))[1:])
    parent = h
    for k in path[:-1]:
        parent = parent[k]
    key, op = path[-1], r.random()
    if op < 0.55:
        new = r.choice(ODD)
    elif op < 0.75:
        new = copy.deepcopy(r.choice(list(nodes(header)))[1])
    elif op < 0.85:
        del parent[key]
        return h, f"drop {path}"
    elif isinstance(parent, dict):
        parent[r.choice(["exec", "children", "bias", "eps", "padding", "kind", "0.step"])] = r.choice(ODD)
        return h, f"add a key beside {path}"
    else:
        parent.insert(key, copy.deepcopy(parent[key]))
        return h, f"repeat {path}"
    parent[key] = new
    return h, f"{path} = {new!r:.60}"


def edit_text(text, r):
    """One byte-level edit of the header text (delete, insert or replace a byte)."""
    i, c = r.randrange(len(text)), r.choice(b'[]{}",:0123456789-.etrufalsn \\\x00\xff')
    op = r.choice(["delete", "insert", "replace"])
    new = text[:i] + (b"" if op == "delete" else bytes([c])) + text[i + (op != "insert"):]
    return new, f"{op} {bytes([c])!r} at header byte {i}"


def mutants(bases, seed):
    r = random.Random(seed)
    for _ in range(BYTE_FLIPS):
        b = bytearray(r.choice(bases))
        for _ in range(r.choice([1, 1, 2, 8])):
            b[r.randrange(len(b))] ^= 1 << r.randrange(8)
        yield bytes(b), "byte flips"
    for _ in range(TRUNCATIONS):
        b = r.choice(bases)
        n = r.randrange(len(b))
        yield b[:n], f"cut at {n}"
    for _ in range(TREE_EDITS):
        version, text, data = split(r.choice(bases))
        h, whats = json.loads(text), []
        for _ in range(r.choice([1, 1, 1, 2, 3])):
            h, what = edit_tree(h, r)
            whats.append(what)
        yield assemble(json.dumps(h).encode(), data, version), "; ".join(whats)
    for _ in range(TEXT_EDITS):
        version, text, data = split(r.choice(bases))
        text, what = edit_text(text.rstrip(b" "), r)
        yield assemble(text, data, version), what


def test_every_mutant_loads_cleanly_or_raises_format_error(bases, tmp_path):
    path, again = tmp_path / "mutant.netcl", tmp_path / "again.netcl"
    outcomes, wrong = {"loaded": 0, "FormatError": 0}, []
    for blob, what in mutants(bases, SEED):
        path.write_bytes(blob)
        for reader in (load, load_checkpoint):
            try:
                got = reader(path)
            except FormatError:
                outcomes["FormatError"] += 1
                continue
            except Exception as e:  # noqa: BLE001 - the point of the test
                wrong.append(f"{reader.__name__}, {what}: {type(e).__name__}: {e!s:.200}")
                continue
            outcomes["loaded"] += 1
            m = got if reader is load else got[0]
            save(m, again)  # whatever loads is a model the writer accepts too
    assert not wrong, f"{len(wrong)} mutants escaped FormatError:\n" + "\n".join(wrong[:30])
    assert outcomes["FormatError"] > outcomes["loaded"] > 0, outcomes
