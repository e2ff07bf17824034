"""No module of shimrt, and no test, uses another shimrt module's underscore names: what one
module needs of another is a public name (a seam worth naming), and a test goes through what a
user or another module would use.

Read from the source with ast. A name counts as private to the module that defines it (a def, a
class, an assignment, an attribute set on any object, a class annotation); an ``x._name`` or an
``import _name`` elsewhere is a use from outside, as is a test's ``setattr(x, "_name", ...)``.
Other libraries' underscore names (``torch._C``, ``os._exit``) are not shimrt's to name."""

from __future__ import annotations

import ast
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]

#: (file, name): a use of an underscore name that is another library's, not shimrt's.
NOT_SHIMRTS = {("shimrt/hip/check.py", "_handle"): "ctypes.CDLL's handle, what hip-python's loader needs",
               ("tests/test_torch_groups.py", "_timeout"): "torch's ProcessGroupNCCL.Options' own timeout, "
                                                            "which shimrt.torch.groups sets",
               ("shimrt/torch/ddp.py", "_version"): "torch's Tensor._version, the count of its in-place changes, "
                                                    "which tells a backward that accumulated a gradient"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined(tree: ast.AST) -> set[str]:
    """The underscore names a module defines."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if _private(n)}


def used_from_outside(tree: ast.AST, own: set[str], shimrts: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every shimrt underscore name ``tree`` uses that it does not define itself."""
    found = []

    def foreign(name: str) -> bool:
        return _private(name) and name in shimrts and name not in own

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and foreign(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("shimrt")):
            found += [(node.lineno, a.name) for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) \
                in ("setattr", "delattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and foreign(node.args[1].value):
            found.append((node.lineno, node.args[1].value))
    return found


def violations(files: list[Path], shimrts: set[str]) -> list[str]:
    out = []
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(TOP).as_posix()
        for line, name in used_from_outside(tree, defined(tree), shimrts):
            if (where, name) not in NOT_SHIMRTS:
                out.append(f"{where}:{line}: {name}")
    return out


def shimrt_privates() -> set[str]:
    names: set[str] = set()
    for path in (TOP / "shimrt").rglob("*.py"):
        names |= defined(ast.parse(path.read_text()))
    return names


def test_no_module_of_shimrt_uses_anothers_underscore_names():
    assert violations(sorted((TOP / "shimrt").rglob("*.py")), shimrt_privates()) == []


def test_no_test_uses_an_underscore_name_of_shimrt():
    assert violations(sorted((TOP / "tests").rglob("*.py")), shimrt_privates()) == []


def test_the_check_sees_each_kind_of_use():
    """What the two checks above would report, on a module written to break each rule."""
    source = ("from shimrt.kernel import _Hidden\n"
              "import shimrt.nccl.library as library\n"
              "x = library._PROCESS\n"
              "def f(monkeypatch, k):\n"
              "    monkeypatch.setattr(library, '_PROCESS', None)\n"
              "    return k._state, self_like._state\n"
              "setattr(library, '_PROCESS', 1)\n"
              "class Mine:\n"
              "    def __init__(self):\n"
              "        self._state = 1\n")
    tree = ast.parse(source)
    got = used_from_outside(tree, defined(tree) - {"_state"}, {"_Hidden", "_PROCESS", "_state"})
    assert sorted(got) == [(1, "_Hidden"), (3, "_PROCESS"), (5, "_PROCESS"), (6, "_state"), (6, "_state"),
                           (7, "_PROCESS")]
    # A module's own privates are its own to use, on any object (a classmethod's new instance, say);
    # an import of an underscore name is always another module's.
    assert used_from_outside(tree, defined(tree), {"_state"}) == [(1, "_Hidden")]
