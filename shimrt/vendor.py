"""Helpers both vendor backends build on (they differ only in the vendor's names).

``shimrt.cuda`` and ``shimrt.hip`` import these; nothing here imports a backend, so the import
arrows run one way: backend -> vendor -> errors.
"""

from __future__ import annotations

from typing import Any, Callable

from .errors import DriverError

__all__ = ["checker", "read_attributes", "ready"]


def checker(describe: Callable) -> tuple[Callable, Callable]:
    """(check, raise_for) for a backend whose ``describe(err)`` gives (name, code, description).

    ``check(result, call)`` unpacks a binding's ``(err, *values)`` tuple: it raises
    :class:`DriverError` named after the vendor error, else returns the value(s).
    """

    def raise_for(call: str, err):
        name, code, desc = describe(err)
        raise DriverError(call, name, code, desc)

    def check(result, call: str):
        err = result[0]
        if int(err) != 0:
            raise_for(call, err)
        if len(result) == 1:
            return None
        return result[1] if len(result) == 2 else result[1:]

    return check, raise_for


def read_attributes(check: Any, table: dict, enum: Any, prefix: str, query: Any, call: str) -> dict:
    """{our name: value} for a table of our name -> the vendor enum member's name less ``prefix``."""
    return {ours: check(query(getattr(enum, prefix + theirs)), call) for ours, theirs in table.items()}


def ready(check: Any, result: Any, not_ready: Any, call: str) -> bool:
    """A stream or event query's answer: False for the vendor's not-ready error, True for success."""
    if result[0] == not_ready:
        return False
    check(result, call)
    return True
