"""The docs hold what the code does: every Python block of Getting started and of the README runs,
in order, as a reader would run it; the Devices page's table has every NETCL_* variable the code
reads; the layers page's table has every layer the exporter knows; the README stays a guide.

Blocks that use the autograd API (docs/API.md, "Programming models") are skipped until netcl has it."""
import os
import re
import subprocess
from pathlib import Path

import pytest

import netcl

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"readme": ROOT / "README.md", "getting-started": ROOT / "docs" / "getting-started.md"}
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
AUTOGRAD = re.compile(r"netcl\.tensor\(|netcl\.no_grad|nn\.functional|\(nn\.Module\)")
needs_autograd = pytest.mark.skipif(not hasattr(netcl, "no_grad"),
                                    reason="uses the autograd API of docs/API.md, 'Programming models' (not in netcl yet)")


def _blocks(page):
    return BLOCK.findall(PAGES[page].read_text())


def _cases():
    for page in PAGES:
        for i, src in enumerate(_blocks(page)):
            marks = [needs_autograd] if AUTOGRAD.search(src) else []
            yield pytest.param(page, i, id=f"{page}-{i}", marks=marks)


class _Reader:
    """A page read from the top: one namespace and one working folder, blocks run in order."""

    def __init__(self, page, folder):
        self.page, self.folder, self.ns, self.done = page, folder, {"__name__": f"docs_{page}"}, 0

    def run_to(self, k):
        blocks = _blocks(self.page)
        while self.done <= k:
            src = blocks[self.done]
            if not (AUTOGRAD.search(src) and not hasattr(netcl, "no_grad")):
                for module in re.findall(r"^\s*(?:import|from) (torch|sklearn|onnxruntime)\b", src, re.M):
                    pytest.importorskip(module)
                _before(self.page, self.done, self.folder)
                cwd = os.getcwd()
                os.chdir(self.folder)
                try:
                    exec(compile(src, f"{PAGES[self.page].name}, python block {self.done}", "exec"), self.ns)
                finally:
                    os.chdir(cwd)
            self.done += 1


def _before(page, i, folder):
    """What a block reads that an earlier, skipped block would have written."""
    if page == "readme" and i == 1 and not (folder / "digits.onnx").exists():
        from netcl import nn
        from netcl.io import export_onnx

        model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(16 * 4 * 4, 10)).eval()
        export_onnx(model, (1, 1, 8, 8), folder / "digits.onnx", dynamic_batch=True)


_readers = {}


@pytest.mark.parametrize("page, i", list(_cases()))
def test_code_block_runs(page, i, tmp_path_factory):
    if page not in _readers:
        _readers[page] = _Reader(page, tmp_path_factory.mktemp(page))
    _readers[page].run_to(i)


def test_pages_have_code_blocks():
    assert len(_blocks("readme")) == 2, "README: the training example and the inference example"
    assert len(_blocks("getting-started")) >= 8


def _env_vars_read():
    """NETCL_* names in the Python code, tools, tests and build files, less -D macros and header guards."""
    paths = [ROOT / "Makefile", ROOT / ".ci" / "run", ROOT / "setup.py"]
    for folder in ("netcl", "tools", "tests"):
        paths += sorted((ROOT / folder).rglob("*.py"))
    names = set()
    for p in paths:
        names.update(m.group(2) for m in re.finditer(r"(-D)?\b(NETCL_[A-Z0-9_]+)", p.read_text())
                     if not m.group(1) and not m.group(2).endswith("_H"))
    return names


def test_every_environment_variable_is_in_the_devices_table():
    page = (ROOT / "docs" / "device-setup.md").read_text()
    table = set(re.findall(r"^\| `(NETCL_[A-Z0-9_]+)` \|", page, re.M))
    read = _env_vars_read()
    assert read - table == set(), f"NETCL_* variables missing from docs/device-setup.md's table: {sorted(read - table)}"
    assert table - read == set(), f"docs/device-setup.md documents variables nothing reads: {sorted(table - read)}"


def test_every_exported_layer_is_in_the_layers_table():
    from netcl.io.onnx_export import EMITTERS, NOT_EMITTED

    page = (ROOT / "docs" / "layers.md").read_text()
    named = set()
    for line in page.splitlines():
        if line.startswith("| `"):
            named.update(re.findall(r"`(\w+)", line.split("|")[1]))
    known = {t.__name__ for t in EMITTERS} | {t.__name__ for t in NOT_EMITTED}
    assert known - named == set(), f"layers missing from docs/layers.md's ONNX table: {sorted(known - named)}"


def test_readme_is_a_guide():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250, "README.md is the guide (at most 250 lines); the rest belongs in docs/"


def test_readme_links_resolve():
    """The README is read on its own (GitHub, PyPI): each relative link must name a file that exists."""
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the docs"
    assert [link for link in local if not (ROOT / link).exists()] == []


def test_no_commit_hashes_in_the_docs():
    """History is git's and CHANGELOG.md's: a README or docs page that cites a commit fails."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    texts = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = []
    for p in texts:
        for token in sorted(set(re.findall(r"\b[0-9a-f]{7,40}\b", p.read_text()))):
            if re.search(r"[a-f]", token) and re.search(r"[0-9]", token):
                r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "-q", "--verify", f"{token}^{{commit}}"],
                                   capture_output=True)
                if r.returncode == 0:
                    found.append(f"{p.name}: {token}")
    assert not found, f"commit hashes in the docs: {found}"


def test_no_dates_in_the_docs():
    """A figure names the netcl version it was measured on, not a day: dates belong to CHANGELOG.md."""
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = [f"{p.name}: {d}" for p in texts for d in re.findall(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b", p.read_text())]
    assert not found, f"dates in the docs: {found}"


def test_docs_folder_holds_no_history_page():
    assert not list((ROOT / "docs").glob("*HISTORY*")), "history lives in git and CHANGELOG.md"
