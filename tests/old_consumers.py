"""Cached virtual environments holding older ONNX consumers, built once per machine, so that a
test can run a file in the consumer a user really has (e.g. onnxruntime 1.15 refuses opset 20).

    python = consumer_python("ort115")   # None (with the reason in .reason) if it cannot be built

The venv lives under $NETCL_CONSUMER_CACHE (default ~/.cache/netcl/<name>-venv); a marker file
records the requirements it was built with, so a changed pin rebuilds it."""
import os
import subprocess
import sys
from pathlib import Path

CONSUMERS = {"ort115": ["onnxruntime==1.15.1", "numpy<2"]}


class Unavailable(str):
    """The reason a consumer venv could not be built (falsy, so `if python:` reads naturally)."""

    def __bool__(self):
        return False


def consumer_python(name):
    requirements = CONSUMERS[name]
    root = Path(os.environ.get("NETCL_CONSUMER_CACHE", Path.home() / ".cache" / "netcl"))
    venv = root / f"{name}-venv"
    python, marker = venv / "bin" / "python", venv / "netcl-requirements.txt"
    if python.exists() and marker.exists() and marker.read_text() == "\n".join(requirements):
        return str(python)
    try:
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True,
                       timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
                       check=True, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or ""
        return Unavailable(f"cannot build a venv with {' '.join(requirements)} in {venv}: {e} {detail[-500:]}")
    marker.write_text("\n".join(requirements))
    return str(python)
