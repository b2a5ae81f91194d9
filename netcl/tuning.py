"""The tuning table (netcl/kernels/tuning.json): register blocks, vector widths and cut-offs of the
kernel families, a row per (group, device class), each saying where it was measured. The one place
netcl reads them; tools/ab_kernels.py measures a change and writes it (write_value).

    tuning.values("conv_train", "cpu16")["RM"]

Device classes are ops.config_class's: "cpu16" (16-wide float vectors: AVX-512 on PoCL), "cpu"
(other CPUs), "gpu". A class without a row of its own in a group takes the group's "*" row, then
(a CPU class) the "cpu" row. The rows are read once per process; values() hands out the same dict
each time (tests change a value for a while with monkeypatch.setitem). The table's "notes", which
no code reads, hold the measurements behind choices fixed in the code rather than in a row (a
define, a constant, a way of writing the kernels), each cited from its comment as "tuning.json's
note on <its "on">"."""
import json
import os
from contextlib import contextmanager
from importlib import resources

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "tuning.json")
_rows = {}  # (group, class) -> values; filled on first use
_version = [0]  # moves on with each override(): caches of what the values decide key on it


def _load():
    if not _rows:
        table = json.loads(resources.files("netcl.kernels").joinpath("tuning.json").read_text())
        for row in table["rows"]:
            _rows[(row["group"], row["class"])] = _ints(row["values"])
    return _rows


def _ints(values):
    """JSON's object keys are strings: those that are numbers (RO's kernel sizes) become ints again."""
    if isinstance(values, dict):
        return {int(k) if isinstance(k, str) and k.isdigit() else k: _ints(v) for k, v in values.items()}
    return tuple(values) if isinstance(values, list) else values


def values(group, cls):
    """The values of `group` for device class `cls` (see the module's doc); KeyError naming the
    group where it has no row for the class."""
    rows = _load()
    for key in ((group, cls), (group, "*")) + (((group, "cpu"),) if cls.startswith("cpu") else ()):
        if key in rows:
            return rows[key]
    raise KeyError(f"the tuning table has no {group!r} row for device class {cls!r} (netcl/kernels/tuning.json)")


def version():
    """A number that changes whenever override() changes or restores a value (route and GEMM plan
    caches key on it)."""
    return _version[0]


@contextmanager
def override(group, cls, key, value):
    """The table's `key` of (group, cls) is `value` while the block runs (tools/ab_kernels.py's side
    B); KeyError naming what there is for a key the row lacks."""
    row = values(group, cls)
    if key not in row:
        raise KeyError(f"the tuning table's {group!r} row for {cls!r} has no {key!r}; expected one of {', '.join(row)}")
    saved, row[key] = row[key], value
    _version[0] += 1
    try:
        yield
    finally:
        row[key] = saved
        _version[0] += 1


def write_value(group, cls, key, value, measured, path=PATH):
    """Set `key` of the (group, cls) row of the table file at `path` to `value`, with `measured`
    ({"cpu", "driver", "commit"}) as the row's provenance; a class without a row gets one (copied
    from the row it took its values from). Written whole (the file's other rows unchanged)."""
    with open(path) as f:
        table = json.load(f)
    rows = table["rows"]
    row = next((r for r in rows if r["group"] == group and r["class"] == cls), None)
    if row is None:
        fallback = values(group, cls)
        base = next(r for r in rows if r["group"] == group and _ints(r["values"]) == fallback)
        row = dict(base, **{"class": cls}, values=json.loads(json.dumps(base["values"])))
        rows.append(row)
    if key not in row["values"]:
        raise KeyError(f"the tuning table's {group!r} rows have no value {key!r}; expected one of "
                       f"{', '.join(row['values'])}")
    row["values"][key] = value
    row["measured"] = dict(measured)
    with open(path + ".tmp", "w") as f:
        json.dump(table, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    _rows.clear()
