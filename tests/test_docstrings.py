"""Every public name has a docstring (the API reference pages are built from them).

The rule: in every module of the netcl package (gen/'s bindings aside),
- the module itself has a docstring;
- so does every class and function it defines whose name has no leading underscore;
- and every method and property such a class defines in its own body (no leading underscore):
  a method that overrides a documented one of a base class inherits its docstring, as `help()`
  and the API reference show it.
Names imported from elsewhere are checked where they are defined.

And the comments and docstrings of netcl's Python and OpenCL sources say why, not when: no timing
log or A/B result (test_comments_say_why_not_when).
"""
import ast
import importlib
import inspect
import io
import pkgutil
import re
import tokenize
from pathlib import Path

import netcl

def _modules():
    yield netcl
    for info in pkgutil.walk_packages(netcl.__path__, "netcl."):
        if not info.name.startswith("netcl._gen"):
            yield importlib.import_module(info.name)


def _undocumented():
    missing = set()
    for m in _modules():
        if not (m.__doc__ or "").strip():
            missing.add(f"module {m.__name__}")
        for name, obj in vars(m).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != m.__name__:
                continue
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            where = f"{m.__name__}.{name}"
            if not (obj.__doc__ or "").strip():
                missing.add(where)
            if inspect.isclass(obj):
                for attr, v in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    if isinstance(v, property):
                        doc = v.__doc__
                    elif inspect.isfunction(v) or isinstance(v, (staticmethod, classmethod)):
                        doc = inspect.getdoc(getattr(obj, attr))  # inherits an overridden method's
                    else:
                        continue
                    if not (doc or "").strip():
                        missing.add(f"{where}.{attr}")
    return missing


def test_public_names_have_docstrings():
    missing = _undocumented()
    assert not missing, f"{len(missing)} public names without a docstring (say what it is, its arguments and " \
                        f"shapes where they help): {sorted(missing)}"


# Comments say why, not when: a measurement's figures and the A/B behind a choice belong in the
# tuning table (netcl/kernels/tuning.json: its rows, or its notes for a choice fixed in the code)
# or in the commit message that made the change, not in a comment as a log of what ran how fast.
_FIG = r"~?\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:ms|us|µs|ns|s|GFLOP/s|GB/s|%|x)(?![\w/])"
_DIARY = re.compile("|".join([
    rf"{_FIG}\s*->\s*~?\d",                          # 0.47 -> 0.25 ms, 4.4 -> 3.2 ms
    rf"\d\s*->\s*{_FIG}",
    rf"{_FIG}(?:\s+[\w'-]+){{0,3}}\s+against\s+~?\d",  # 15 us against 35
    rf"\b(?:took|ran|was|were|spent)\b(?:\s+[\w'(),-]+){{0,4}}?\s+(?:at\s+)?{_FIG}",  # took 1.6 ms
    r"\d(?:\.\d+)?x\s+(?:faster|slower|as long|as fast|the time)\b",  # 1.07-1.17x slower
    r"\d(?:\.\d+)?%\s+(?:faster|slower)\b",
    r"[(,;]\s*(?:paired|profiled)\b|\bpaired runs?\b",  # (..., paired), (profiled), in paired runs
    r"\b20\d\d-\d\d-\d\d\b",                         # a date
]), re.I)
_ROOT = Path(__file__).resolve().parents[1]


def _comments_py(path):
    """The comments and docstrings of a Python file, each with its first line."""
    text = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def _comments_cl(path):
    """The comments of an OpenCL C file (// to the line's end, /* .. */), each with its first line."""
    text = path.read_text()
    for m in re.finditer(r"//[^\n]*|/\*.*?\*/", text, re.S):
        yield text.count("\n", 0, m.start()) + 1, m.group()


def _blocks(comments):
    """Runs of comments on consecutive lines joined into one text, so that a figure and its
    comparison split over two lines are read together."""
    start = last = None
    parts = []
    for line, text in sorted(comments):
        if parts and line > last + 1:
            yield start, " ".join(parts)
            parts = []
        if not parts:
            start = line
        parts.append(re.sub(r"^\s*(//|#|/\*)\s?", "", text, flags=re.M).replace("\n", " "))
        last = line + text.count("\n")
    if parts:
        yield start, " ".join(parts)


def _diaries():
    found = []
    for path in sorted((_ROOT / "netcl").rglob("*")):
        if "_gen" in path.parts or path.suffix not in (".py", ".cl", ".h"):
            continue
        comments = _comments_py(path) if path.suffix == ".py" else _comments_cl(path)
        for line, text in _blocks(comments):
            for m in _DIARY.finditer(" ".join(text.split())):
                found.append(f"{path.relative_to(_ROOT)}:{line}: ...{m.group()}...")
    return found


def test_comments_say_why_not_when():
    found = _diaries()
    assert not found, (f"{len(found)} comments read as a timing log or an A/B result (the figures belong in "
                       "netcl/kernels/tuning.json or the commit message; the comment keeps the reason, in the "
                       "present tense): " + "; ".join(found))
