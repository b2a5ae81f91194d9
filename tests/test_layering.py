"""The library never imports its applications: no module of netcl/ outside netcl/apps/ imports
netcl.apps, at module level or inside a function, absolutely or relatively, or names it by string
(importlib.import_module)."""
import ast
from pathlib import Path

NETCL = Path(__file__).resolve().parents[1] / "netcl"
APPS = NETCL / "apps"


def _module_name(path):
    parts = path.relative_to(NETCL.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path, text=None):
    """(line, module name) for every import in the file (or in `text`, read as that file),
    relative ones resolved, and every string constant (a name given to importlib)."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            yield node.lineno, base
            for alias in node.names:  # `from netcl import apps`
                yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def _is_apps(name):
    return name == "netcl.apps" or name.startswith("netcl.apps.")


def core_files():
    return [p for p in sorted(NETCL.rglob("*.py")) if APPS not in p.parents]


def test_the_walk_sees_the_core_and_resolves_relative_imports():
    names = {str(p.relative_to(NETCL)) for p in core_files()}
    assert {"__init__.py", "tensor.py", "io/onnx_export.py", "io/netcl_format.py"} <= names
    assert not any(n.startswith("apps") for n in names)
    io_module = NETCL / "io" / "x.py"
    assert (1, "netcl.io.atomic") in set(_imported(io_module, "from .atomic import AtomicFile"))
    assert (1, "netcl.apps.cli") in set(_imported(io_module, "from ..apps import cli"))
    assert (1, "netcl.apps") in set(_imported(NETCL / "x.py", "from . import apps"))
    assert (2, "netcl.apps.bench") in set(_imported(io_module, "def f():\n    import netcl.apps.bench"))


def test_the_core_never_imports_the_applications():
    found = [f"{p.relative_to(NETCL.parent)}:{line} imports {name}"
             for p in core_files() for line, name in _imported(p) if _is_apps(name)]
    assert not found, "the library must not depend on netcl.apps:\n" + "\n".join(found)
