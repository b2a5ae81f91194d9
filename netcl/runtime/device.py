"""OpenCL device selection: NETCL_DEVICE = gpu | cpu | <name substring>; default first GPU, else first CPU."""
import os
from dataclasses import dataclass

from netcl.errors import NoDeviceError

_INSTALL_HINT = (
    "netcl needs an OpenCL platform. On a plain CPU machine install PoCL: "
    "`pip install pocl-binary-distribution` (or `pip install netcl[cpu]`, or Debian's "
    "`apt-get install pocl-opencl-icd`). On NVIDIA GPUs register the driver's libnvidia-opencl.so.1 "
    "in an .icd file under /etc/OpenCL/vendors (or OCL_ICD_VENDORS)."
)


@dataclass(frozen=True)
class DeviceInfo:
    platform: str
    name: str
    type: str  # "gpu", "cpu", "accelerator" or "other"
    index: int  # position in the flat list of all devices

    def __str__(self):
        return f"[{self.index}] {self.type.upper():4s} {self.name} ({self.platform})"


def _cl():
    try:
        import pyopencl as cl
    except ImportError as e:  # the export-only install has no pyopencl
        raise NoDeviceError(f"pyopencl is not installed ({e}). `pip install pyopencl`. " + _INSTALL_HINT) from e
    return cl


def _all_devices():
    cl = _cl()
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:  # the ICD loader reports "no platforms" as an error
        raise NoDeviceError(f"no OpenCL platform found ({e}). " + _INSTALL_HINT) from e
    out = []
    for p in platforms:
        try:
            out.extend((p, d) for d in p.get_devices())
        except cl.Error:
            continue  # a platform with no devices
    if not out:
        raise NoDeviceError("no OpenCL device found. " + _INSTALL_HINT)
    return out


def _type_name(d):
    cl = _cl()
    if d.type & cl.device_type.GPU:
        return "gpu"
    if d.type & cl.device_type.CPU:
        return "cpu"
    if d.type & cl.device_type.ACCELERATOR:
        return "accelerator"
    return "other"


def devices():
    """All OpenCL devices as DeviceInfo(platform, name, type, index)."""
    return [DeviceInfo(p.name.strip(), d.name.strip(), _type_name(d), i) for i, (p, d) in enumerate(_all_devices())]


def select_device(spec=None):
    """The pyopencl.Device chosen by `spec` (default: $NETCL_DEVICE, else first GPU, else first CPU)."""
    spec = (spec if spec is not None else os.environ.get("NETCL_DEVICE", "")).strip()
    pairs = _all_devices()
    if spec.lower() in ("gpu", "cpu"):
        hits = [d for p, d in pairs if _type_name(d) == spec.lower()]
    elif spec:
        hits = [d for p, d in pairs if spec.lower() in f"{p.name} {d.name}".lower()]
    else:
        hits = [d for p, d in pairs if _type_name(d) == "gpu"] or [d for p, d in pairs if _type_name(d) == "cpu"]
        hits = hits or [d for _, d in pairs]
    if not hits:
        found = ", ".join(f"{d.name.strip()} ({p.name.strip()})" for p, d in pairs)
        raise NoDeviceError(f"NETCL_DEVICE={spec!r} matches no OpenCL device; expected 'gpu', 'cpu' or a "
                            f"substring of one of: {found}")
    return hits[0]
