"""The tuning table (netcl/kernels/tuning.json, netcl.tuning): one place for the kernel families'
blocks and cut-offs, a row per (group, device class) saying where it was measured; overridden for a
while (tools/ab_kernels.py's side B) and written by that tool."""
import importlib.util
import json
import os
import re
import shutil

import pytest

from netcl import tuning

AB_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "ab_kernels.py")


def test_every_row_says_where_it_was_measured_and_every_class_finds_its_values():
    with open(tuning.PATH) as f:
        rows = json.load(f)["rows"]
    assert {(r["group"], r["class"]) for r in rows} >= {("conv_train", "cpu16"), ("conv_train", "cpu"),
                                                        ("gemm_cpu", "cpu16"), ("gemm_gpu", "gpu")}
    for r in rows:
        assert set(r["measured"]) == {"cpu", "driver", "commit"} and r["why"], r["group"]
    assert tuning.values("conv_train", "cpu16")["RO"] == {3: 3, 5: 1}  # JSON's string keys, ints again
    assert tuning.values("conv_cutoffs", "cpu16") is tuning.values("conv_cutoffs", "gpu")  # the "*" row
    assert tuning.values("gemm_cpu", "cpu8x") == tuning.values("gemm_cpu", "cpu")  # a CPU class without a row
    with pytest.raises(KeyError, match="no 'gemm_gpu' row for device class 'cpu16'"):
        tuning.values("gemm_gpu", "cpu16")


def test_an_override_lasts_its_block_and_moves_the_version():
    before, v = tuning.values("conv_train", "cpu")["RM"], tuning.version()
    with tuning.override("conv_train", "cpu", "RM", 7):
        assert tuning.values("conv_train", "cpu")["RM"] == 7 and tuning.version() > v
    assert tuning.values("conv_train", "cpu")["RM"] == before and tuning.version() > v + 1
    with pytest.raises(KeyError, match="has no 'NOPE'"):
        with tuning.override("conv_train", "cpu", "NOPE", 1):
            pass


def test_write_value_records_the_value_and_where_it_was_measured(tmp_path, monkeypatch):
    path = str(tmp_path / "tuning.json")
    shutil.copy(tuning.PATH, path)
    where = {"cpu": "a test CPU", "driver": "a test driver", "commit": "abc1234"}
    tuning.write_value("conv_train", "cpu", "RM", 2, where, path=path)
    tuning.write_value("gemm_cpu", "cpu8x", "KC", 128, where, path=path)  # a class without a row: one made
    with open(path) as f:
        rows = {(r["group"], r["class"]): r for r in json.load(f)["rows"]}
    with open(tuning.PATH) as f:
        original = {(r["group"], r["class"]): r for r in json.load(f)["rows"]}
    assert rows[("conv_train", "cpu")]["values"]["RM"] == 2 and rows[("conv_train", "cpu")]["measured"] == where
    assert rows[("gemm_cpu", "cpu8x")]["values"] == dict(original[("gemm_cpu", "cpu")]["values"], KC=128)
    assert all(rows[k] == original[k] for k in original if k != ("conv_train", "cpu"))
    with pytest.raises(KeyError, match="no value 'NOPE'"):
        tuning.write_value("conv_train", "cpu", "NOPE", 1, where, path=path)


def test_ab_kernels_takes_a_setting_it_can_check():
    spec = importlib.util.spec_from_file_location("ab_kernels", AB_PATH)
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    assert ab.parse_setting("conv_train.RM=4", "cpu16") == ("conv_train", "cpu16", "RM", 4)
    assert ab.parse_setting("conv_cutoffs.narrow_widths=[4, 8]", "cpu") == ("conv_cutoffs", "cpu", "narrow_widths",
                                                                            [4, 8])
    for bad, message in (("conv_train.RM", "GROUP.KEY=VALUE"), ("conv_train.RM=four", "must be JSON"),
                         ("conv_train.NOPE=1", "no 'NOPE'")):
        with pytest.raises(ValueError, match=message):
            ab.parse_setting(bad, "cpu16")


def test_every_note_says_what_was_measured_and_every_citation_finds_what_it_cites():
    """A choice fixed in the code keeps its measurement in the table's notes; a comment cites a note
    as "tuning.json's note on <on>)" and a row's value as "tuning.json's <group>, <key>"."""
    with open(tuning.PATH) as f:
        table = json.load(f)
    notes = {n["on"]: n for n in table["notes"]}
    for n in table["notes"]:
        assert set(n) == {"on", "where", "class", "value", "measured", "why", "command"}, n["on"]
        assert set(n["measured"]) == {"cpu", "driver", "commit"} and n["why"] and n["command"], n["on"]
    keys = {}
    for r in table["rows"]:
        keys.setdefault(r["group"], set()).update(r["values"])
    root = os.path.join(os.path.dirname(tuning.__file__))
    cited, bad = set(), []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith((".py", ".cl", ".h")) and "_gen" not in folder:
                text = open(os.path.join(folder, name)).read()
                cited.update(re.findall(r"tuning\.json's note on ([^)\n]+)\)", text))
                for group, key in re.findall(r"tuning\.json's (\w+)(?: rows?)?(?:, (\w+\*?))?", text):
                    if group != "note" and (group not in keys or key and not any(
                            k == key or key.endswith("*") and k.startswith(key[:-1]) for k in keys[group])):
                        bad.append(f"{name}: tuning.json's {group}, {key}")
    assert cited == set(notes), f"cited without a note: {sorted(cited - set(notes))}; " \
                                f"notes nothing cites: {sorted(set(notes) - cited)}"
    assert not bad, f"citations of rows or values the table lacks: {bad}"
