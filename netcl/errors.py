"""netcl's error types. Argument errors are plain ValueError/TypeError."""


class NetclError(Exception):
    """Base class of netcl's own errors."""


class NoDeviceError(NetclError, RuntimeError):
    """No OpenCL platform or device could be found or matched."""


class CompileError(NetclError, RuntimeError):
    """An OpenCL program failed to build; `log` holds the compiler's build log."""

    def __init__(self, message, log=""):
        super().__init__(f"{message}\n--- build log ---\n{log}" if log else message)
        self.log = log


class FormatError(NetclError, ValueError):
    """A .netcl file (or checkpoint) is corrupt, truncated, or not a netcl file."""
