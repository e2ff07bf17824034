"""The exceptions shimrt raises. Every failure a user can cause or meet is one of these."""

from __future__ import annotations


class ShimrtError(Exception):
    """Base class of every error shimrt raises on purpose."""


class DriverError(ShimrtError):
    """A vendor driver or runtime call failed.

    ``name`` is the vendor's error name (``CUDA_ERROR_INVALID_VALUE``, ``hipErrorNoDevice``),
    ``code`` its number, ``description`` the vendor's text and ``call`` the function that failed.
    """

    def __init__(self, call: str, name: str, code: int, description: str):
        self.call, self.name, self.code, self.description = call, name, code, description
        super().__init__(f"{call} failed: {name} ({code}): {description}")


class CompileError(ShimrtError):
    """Run-time compilation failed; carries the compiler's log, the options and the source name."""

    def __init__(self, message: str, *, log: str = "", options: tuple[str, ...] = (), name: str = ""):
        self.log, self.options, self.name = log, tuple(options), name
        text = f"{message}\n  source: {name}\n  options: {' '.join(options)}"
        if log.strip():
            text += "\n  compiler log:\n" + "\n".join("    " + line for line in log.strip().splitlines())
        super().__init__(text)


class NoDeviceError(ShimrtError):
    """No usable GPU: no driver, no device, or a device index that does not exist."""


class CollectiveError(ShimrtError):
    """A collective communication library (NCCL or RCCL) call failed or timed out."""


class UsageError(ShimrtError, ValueError, TypeError):
    """A call was given arguments it cannot use (wrong count, type, size or range).

    Raised before anything reaches the GPU. It is also a ValueError and a TypeError, so code
    written against the built-in exceptions keeps working.
    """
