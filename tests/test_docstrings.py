"""Every public name has a docstring (the API reference pages are built from them).

The rule: in every module of the netcl package (gen/'s bindings aside),
- the module itself has a docstring;
- so does every class and function it defines whose name has no leading underscore;
- and every method and property such a class defines in its own body (no leading underscore):
  a method that overrides a documented one of a base class inherits its docstring, as `help()`
  and the API reference show it.
Names imported from elsewhere are checked where they are defined.
"""
import importlib
import inspect
import pkgutil

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
