"""Benchmarks: ``python -m shimrt.bench launch`` (more subcommands arrive with later issues).

Benchmarks print ratios measured side by side in one run; they are never asserted in tests.
"""

__all__ = []
