"""The exceptions shimrt raises. Every failure a user can cause or meet is one of these."""

from __future__ import annotations

__all__ = ["ShimrtError", "DriverError", "CompileError", "NoDeviceError", "CollectiveError", "UsageError",
           "STICKY_ERRORS"]


class ShimrtError(Exception):
    """Base class of every error shimrt raises on purpose."""


#: Vendor errors after which the context (CUDA) or device (HIP) is unusable until the process
#: exits: a kernel faulted, and every later call fails with the same error.
STICKY_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_LAUNCH_TIMEOUT", "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "hipErrorIllegalAddress", "hipErrorLaunchFailure", "hipErrorLaunchTimeOut", "hipErrorAssert",
    "hipErrorECCNotCorrectable", "hipErrorContextIsDestroyed"})


class DriverError(ShimrtError):
    """A vendor driver or runtime call failed.

    ``name`` is the vendor's error name (``CUDA_ERROR_INVALID_VALUE``, ``hipErrorNoDevice``),
    ``code`` its number, ``description`` the vendor's text and ``call`` the function that failed.
    """

    def __init__(self, call: str, name: str, code: int, description: str):
        self.call, self.name, self.code, self.description = call, name, code, description
        super().__init__(f"{call} failed: {name} ({code}): {description}")

    @property
    def sticky(self) -> bool:
        """The context (device) is unusable from now on (:data:`STICKY_ERRORS`): nothing after
        this error can be trusted, where an unsupported feature or a bad value leaves it sound."""
        return self.name in STICKY_ERRORS


class CompileError(ShimrtError):
    """Run-time compilation failed; carries the compiler's log, the options and the source name."""

    def __init__(self, message: str, *, log: str = "", options: tuple[str, ...] = (), name: str = ""):
        self.log, self.options, self.name = log, tuple(options), name
        text = f"{message}\n  source: {name}\n  options: {' '.join(options)}"
        if log.strip():
            text += "\n  compiler log:\n" + "\n".join("    " + line for line in log.strip().splitlines())
        super().__init__(text)


class NoDeviceError(ShimrtError):
    """No usable GPU: no driver, no device, or a device index that does not exist. ``missing``:
    the backend's Python binding itself is not installed (a backend the user may not want)."""

    def __init__(self, message: str = "", *, missing: bool = False):
        super().__init__(message)
        self.missing = missing


class CollectiveError(ShimrtError):
    """A collective communication library (NCCL or RCCL) call failed or timed out."""


class UsageError(ShimrtError, ValueError, TypeError):
    """A call was given arguments it cannot use (wrong count, type, size or range).

    Raised before anything reaches the GPU. It is also a ValueError and a TypeError, so code
    written against the built-in exceptions keeps working.
    """
