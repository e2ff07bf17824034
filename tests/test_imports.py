"""shimrt's modules import each other without a loop: a loop makes import order matter, and a
module half-initialised when another reads it fails in ways that depend on who imported first.

The graph is read from the source with ast, imports inside functions included; an import under
``if TYPE_CHECKING:`` is left out, since it never runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "shimrt"


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


class Imports(ast.NodeVisitor):
    """The shimrt modules one module imports when it runs."""

    def __init__(self, name: str, path: Path, known: dict[str, Path]):
        self.name, self.known, self.found = name, known, set()
        self.package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")[:len(self.package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:  # "from . import x" imports the module x where there is one
            self.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in self.known else target)

    def add(self, target: str) -> None:
        while target not in self.known and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in self.known and target != self.name:
            self.found.add(target)


def graph() -> dict[str, set[str]]:
    known = modules()
    edges = {}
    for name, path in known.items():
        visitor = Imports(name, path, known)
        visitor.visit(ast.parse(path.read_text(), str(path)))
        edges[name] = visitor.found
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_shimrt_has_no_import_cycle():
    edges = graph()
    found = cycles(edges)
    assert not found, "\n".join(f"{group}: " + "; ".join(f"{m} -> {sorted(edges[m] & set(group))}" for m in group)
                                for group in found)


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_cycle_finder_finds_what_is_there(edges, expected):
    assert cycles(edges) == expected


def test_imports_inside_functions_count_and_type_checking_ones_do_not(tmp_path):
    pkg = {"p": tmp_path / "__init__.py", "p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py"}
    pkg["p.a"].write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n"
                          "def f():\n    from .b import g\n")
    seen = Imports("p.a", pkg["p.a"], pkg)
    seen.visit(ast.parse(pkg["p.a"].read_text()))
    assert seen.found == {"p.b"}  # the one inside f(), not the TYPE_CHECKING one
    pkg["p.a"].write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n")
    seen = Imports("p.a", pkg["p.a"], pkg)
    seen.visit(ast.parse(pkg["p.a"].read_text()))
    assert seen.found == set()


def test_dir_of_shimrt_shows_the_public_api_only():
    import importlib

    import shimrt
    import shimrt.validate  # noqa: F401 - a helper bound on the package by its import
    shown = dir(shimrt)
    assert "validate" not in shown and "cache" not in shown and "Device" in shown and "nccl" in shown
    for name in shimrt.PACKAGES:
        assert importlib.util.find_spec(f"shimrt.{name}") is not None, name


def test_the_core_modules_never_import_the_layers_above_them():
    """The layers, lowest first: the core (the modules in shimrt/ itself: devices, memory,
    kernels, compiling), then ``nccl``, ``overlap``, ``torch``, then the process tools
    (``launch``, ``selftest``) and ``bench``. A core module imports none of the layers above;
    ``nccl`` none of the process tools."""
    edges = graph()

    def within(module: str, packages: tuple[str, ...]) -> bool:
        return any(module == p or module.startswith(p + ".") for p in packages)
    upper = ("shimrt.nccl", "shimrt.overlap", "shimrt.torch", "shimrt.launch", "shimrt.selftest", "shimrt.bench")
    core = [m for m in edges if m.count(".") == 1 and not within(m, upper) and m != "shimrt.__main__"]
    bad = {m: sorted(t for t in edges[m] if within(t, upper)) for m in core}
    assert not {m: t for m, t in bad.items() if t}, bad
    tools = ("shimrt.launch", "shimrt.selftest", "shimrt.bench")
    nccl = {m: sorted(t for t in e if within(t, tools)) for m, e in edges.items() if within(m, ("shimrt.nccl",))}
    assert not {m: t for m, t in nccl.items() if t}, nccl
