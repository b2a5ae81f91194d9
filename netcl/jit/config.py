"""The fused path's tuning knobs: one frozen JitConfig, read from the environment by
JitConfig.from_env() when an executable is made (never in the hot path or deep in a family)."""
import os
from dataclasses import dataclass
from typing import Optional, Tuple

from netcl.convspec import winot_choice


def _ints(name):
    """The comma-separated integers of $name, or None when it is unset or empty."""
    text = os.environ.get(name)
    return tuple(int(v) for v in text.split(",")) if text else None


@dataclass(frozen=True)
class JitConfig:
    # NETCL_JIT_CLASS=gpu|cpu: the kernel families to use; None (unset) = the device's own class.
    # Tests set "gpu" to run the GPU family on PoCL.
    jit_class: Optional[str] = None
    # NETCL_GPU_SPLIT: "0" turns split-K off in the GPU conv family; anything else (default "1") leaves it on.
    gpu_split: bool = True
    # NETCL_GPU_SPLIT_ATOMIC=0: split-K in two launches (conv_gpu_reduce) even on a device whose OpenCL
    # 2 atomics let one launch finish each tile (tests compare both)
    gpu_split_atomic: bool = True
    # NETCL_CPU_CONV="maxvw,rm": the CPU direct conv's widest vector and output channels per
    # work-item; default 16,8, measured fastest on AVX-512 (docs/performance.md has the figures).
    cpu_conv: Tuple[int, int] = (16, 8)
    # NETCL_CPU_WINO=0|2|4: forces the Winograd output tile on the CPU (0 = direct convolution);
    # None (unset) = chosen by shape.
    cpu_wino: Optional[int] = None
    # NETCL_CPU_WINOT=0|1: the tile-lane Winograd family (conv_wino.ConvWinoT) off, or on wherever
    # its layout fits; None (unset) = on AVX-512-class devices (native float16) unless
    # NETCL_CPU_WINO forces a family.
    cpu_winot: Optional[bool] = None
    # NETCL_CPU_WINO_BLOCK="tb,rv,nsub": the Winograd register block (tiles x float8 channel
    # vectors) and sub-blocks per work-item; None (unset) = chosen by shape.
    cpu_wino_block: Optional[Tuple[int, int, int]] = None

    @classmethod
    def from_env(cls):
        """The config that the environment variables above describe (unset or empty: the default)."""
        wino = os.environ.get("NETCL_CPU_WINO")
        return cls(jit_class=os.environ.get("NETCL_JIT_CLASS") or None,
                   gpu_split=os.environ.get("NETCL_GPU_SPLIT", "1") != "0",
                   gpu_split_atomic=os.environ.get("NETCL_GPU_SPLIT_ATOMIC", "1") != "0",
                   cpu_conv=_ints("NETCL_CPU_CONV") or cls.cpu_conv,
                   cpu_wino=int(wino) if wino else None,
                   cpu_winot=winot_choice(os.environ.get("NETCL_CPU_WINOT")),
                   cpu_wino_block=_ints("NETCL_CPU_WINO_BLOCK"))
