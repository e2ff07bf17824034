"""What every shimrt command line shares: its parser, ``--version``, the checks of paths it
will write, and the wrapper that turns errors into one line and an exit code.

Every command's ``main(argv)`` is ``cli.main(parser, argv)``: argparse refuses a bad value
(exit 2) before anything runs, the environment (``SHIMRT_*``) is read next, then the
command's ``check(args)`` (relations between options) and only then its ``run(args)``. A
:class:`ShimrtError` or :class:`OSError` becomes ``<command>: <message>`` on stderr and exit
code 2, Ctrl-C exit code 130, as torchrun and nccl-tests users expect; never a traceback.
Every environment variable shimrt reads is checked (:func:`shimrt.config.check`) before the
command's own checks, whether or not the run would reach it.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from . import __version__, config, validate
from .errors import ShimrtError, UsageError

__all__ = ["summary", "parser", "subcommand", "main", "finish", "add_json", "writable_folder", "add_timeout",
           "deadline", "count", "distinct", "nbytes", "integer_text", "number_text", "renamed"]

VERSION = f"shimrt {__version__}"
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :class:`Device` -> Device


def _plain(doc: str) -> str:
    """A docstring without its reStructuredText markup, for a terminal."""
    return _ROLE.sub(r"\1", doc).replace("``", "").replace("::\n", ":\n")


def summary(doc: str | None) -> str:
    """The first paragraph of a docstring on one line: the sentence that says what a command does."""
    first = (doc or "").strip().split("\n\n")[0]
    return " ".join(_plain(first).split())


def description(doc: str | None) -> str:
    """The whole docstring, as ``--help`` prints it (line breaks kept)."""
    return _plain((doc or "").strip())


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: prints ``shimrt <version>`` and exits 0."""
    parser.add_argument("--version", action="version", version=VERSION, help="print shimrt's version and exit")


def parser(prog: str, doc: str | None, **kwargs: Any) -> argparse.ArgumentParser:
    """A command's parser: ``prog`` as typed (``python -m shimrt.bench``), the whole ``doc`` as its
    description, and ``--version``."""
    p = argparse.ArgumentParser(prog=prog, description=description(doc),
                                formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
    add_version(p)
    return p


def subcommand(subparsers: Any, name: str, doc: str | None) -> argparse.ArgumentParser:
    """A subcommand's parser (``bench overlap``): listed with its summary, described by the
    whole ``doc``, with ``--version``; errors are reported under its own name."""
    p = subparsers.add_parser(name, help=summary(doc), description=description(doc),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(p)
    p.set_defaults(command=_name(p.prog))
    return p


def main(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None,
         run: Callable[[argparse.Namespace], int] | None = None) -> int:
    """Parse ``argv``, check, and run: ``run(args)``, or the ``run`` the (sub)parser set as a
    default (with its ``check``, if any, first). Returns the exit code instead of raising
    SystemExit, so that tests and other tools can call a command's ``main(argv)`` in-process."""
    try:
        return _main(parser, argv, run)
    except BrokenPipeError:
        # The reader left (| head), maybe in the middle of --help: say nothing more, and keep
        # Python from complaining about stdout at exit.
        _silence_stdout()
        return 141


def _main(parser, argv, run) -> int:
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a refused value (2): argparse has said why
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    command = getattr(args, "command", None) or _name(parser.prog)
    try:
        config.check()  # a bad SHIMRT_* (or launch) variable is refused before anything runs
        check = getattr(args, "check", None)
        if check is not None:
            check(args)
        return (run or args.run)(args)
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise
    except ShimrtError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{command}: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"{command}: out of host memory (are the sizes asked for too large?)", file=sys.stderr)
        return 2


def finish(text: str, data: Any, path: Any, *, indent: int | None = 2, say: bool = False) -> int:
    """A command's end: print ``text``, write ``data`` as JSON to ``path`` (--json; None: not
    asked), saying so when ``say``; the exit code, 0."""
    if text:
        print(text, flush=True)
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=indent)
        if say:
            print(f"wrote {path}")
    return 0


def add_json(p: argparse.ArgumentParser, what: str = "also write the results as JSON") -> None:
    """``--json PATH``, a file the run will write, checked before the run starts."""
    p.add_argument("--json", metavar="PATH", type=validate.argument(validate.writable_file, "--json"), help=what)


def writable_folder(value: Any, what: str) -> Path:
    """A folder a run will write into: an existing writable folder, or one that can be created
    (its nearest existing parent is a writable folder). Checked before the run starts."""
    path = Path(validate.text(value, what, path=True))
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{what} must be a folder, not the file {str(path)!r}")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{what}: the folder {str(path)!r} is not writable")
        return path
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{what}: {str(path)!r} cannot be created: {str(parent)!r} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{what}: {str(path)!r} cannot be created: {str(parent)!r} is not writable")
    return path


def add_timeout(p: argparse.ArgumentParser, default: float) -> None:
    """``--timeout S``: the whole run's limit (see :func:`deadline`)."""
    from .stream import MAX_TIMEOUT
    p.add_argument("--timeout", metavar="S", default=float(default),
                   type=validate.argument(validate.number, "--timeout", positive=True, most=MAX_TIMEOUT),
                   help=f"end the run with every thread's stack on stderr after S seconds (default {default:g}): a "
                        "hung call never holds the machine")


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every thread's stack on stderr and exit code 1 when the block outlives ``seconds``.
    faulthandler's own C thread fires it, so a main thread stuck inside C (a blocking NCCL call,
    a synchronize) is no obstacle, and the stacks say where it was."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def count(name: str, least: int = 1) -> Callable[[str], int]:
    """An argparse ``type=`` for a count (iterations, calls, steps): an int from ``least`` to a C
    int's largest. More would never end (nor fit the vendor APIs' ints): a typo, not a request."""
    return validate.argument(validate.integer, name, least=least, most=validate.MAX_INT32)


def distinct(check: Callable[..., Any], name: str, **limits: Any) -> Callable[[str], list]:
    """An argparse ``type=`` for a comma-separated list whose items pass ``check`` and differ
    (a value given twice would be measured twice and reported as two rows of one name)."""
    items = validate.listed(check, name, **limits)

    def convert(raw: str) -> list:
        values = items(raw)
        for i, value in enumerate(values):
            if value in values[:i]:
                raise argparse.ArgumentTypeError(f"{name} must list each value once, not {value!r} twice")
        return values
    convert.__name__ = name
    return convert


def nbytes(value: Any, what: str, *, least: int = 1, most: int | None = None) -> int:
    """:func:`validate.nbytes`, saying its upper limit as it is written (4G, not 4294967296)."""
    count = validate.nbytes(value, what, least=least)
    if most is not None and count > most:
        raise UsageError(f"{what} must be at most {size_text(most)}, not {value!r}")
    return count


def size_text(count: int) -> str:
    """A byte count with the largest K/M/G/T suffix that divides it: 4294967296 -> "4G"."""
    for suffix, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if count and count % (1 << shift) == 0:
            return f"{count >> shift}{suffix}"
    return str(count)


def integer_text(raw: Any, what: str) -> int:
    """The int a command-line string spells (for checks that take the raw string)."""
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be an int, not {validate.shown(raw)}") from None


def number_text(raw: Any, what: str) -> float:
    """The float a command-line string spells (for checks that take the raw string)."""
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a number, not {validate.shown(raw)}") from None


def renamed(exc: UsageError, field: str, what: str) -> UsageError:
    """A spec's refusal of ``field`` told about the option it came from: "size must be ..." from
    ComputeSpec becomes "--size must be ..."; other messages are prefixed with the option."""
    message = str(exc)
    if message.startswith(f"{field} must"):
        return UsageError(what + message[len(field):])
    return UsageError(f"{what}: {message}")


def _name(prog: str) -> str:
    return prog.removeprefix("python -m ").strip()


def _silence_stdout() -> None:
    try:
        sys.stdout.flush()
    except OSError:
        pass
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file behind stdout (captured in tests)
        pass
