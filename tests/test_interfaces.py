"""Every module of shimrt says its interface in ``__all__``, and shimrt, its scripts and examples
use of another shimrt module only what that names: the rest of a module is its own (helpers a
test may still reach, to test them, but that no other module or user builds on).

Read from the source with ast: ``from shimrt.x import name`` (and the relative forms), and
``module.name`` on a name bound to a shimrt module by an import. ``__main__`` modules are run,
never imported: they have no interface. Code in strings (``python -c`` lines of
``scripts/sweep_bad_inputs.py``, which tries bad inputs at helpers as the tests do) is not read."""

from __future__ import annotations

import ast
import importlib
import re
import types
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[1]


def module_names() -> dict[str, Path]:
    """Dotted name -> file, for every module under shimrt/ but the ``__main__`` ones."""
    out = {}
    for path in sorted((TOP / "shimrt").rglob("*.py")):
        parts = path.relative_to(TOP).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = module_names()


def is_module(package: str, name: str) -> bool:
    """Whether ``package.name`` is a module, not a name the package's ``__init__`` binds over its
    submodule of that name (``shimrt.nccl.group`` is the function)."""
    if f"{package}.{name}" not in MODULES:
        return False
    value = getattr(importlib.import_module(package), name, None)
    return value is None or isinstance(value, types.ModuleType)


def uses(tree: ast.AST, package: str) -> list[tuple[int, str, str]]:
    """(line, module, name) for each name ``tree`` takes from a shimrt module; ``package``: the
    package the file is in (for relative imports), "" outside shimrt."""
    found, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                if alias.name == "__main__":  # a module run, not a name
                    continue
                if is_module(base, alias.name):
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif base in MODULES:
                    found.append((node.lineno, base, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES and alias.asname:
                    bound[alias.asname] = alias.name
                elif alias.name.split(".")[0] == "shimrt":
                    bound["shimrt"] = "shimrt"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if not (isinstance(value, ast.Name) and value.id in bound):
                continue
            module = bound[value.id]
            for attr in reversed(chain):  # shimrt.nccl.library.load: the modules, then the name
                if is_module(module, attr):
                    module = f"{module}.{attr}"
                    continue
                if node.attr == attr:  # each use once: at its own Attribute node
                    found.append((node.lineno, module, attr))
                break
    return found


def violations(files: dict[str, str]) -> list[str]:
    """Each use in ``files`` (path relative to the top -> source) of a name another shimrt module
    leaves out of its ``__all__``."""
    interfaces = {name: set(importlib.import_module(name).__all__) for name in MODULES}
    out = []
    for where, source in files.items():
        rel = Path(where)
        own = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        package = ".".join(rel.parts[:-1]) if rel.parts[0] == "shimrt" else ""
        for line, module, name in uses(ast.parse(source), package):
            if module != own and name not in interfaces[module]:
                out.append(f"{where}:{line}: {module}.{name} is not in its __all__")
    return out


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_module_names_its_interface(name):
    module = importlib.import_module(name)
    interface = getattr(module, "__all__", None)
    assert isinstance(interface, list), f"{name} has no __all__ list"
    assert len(set(interface)) == len(interface), f"{name}.__all__ names one thing twice"
    assert [n for n in interface if not hasattr(module, n)] == [], f"{name}.__all__ names what it lacks"


def test_the_backends_offer_what_their_protocols_ask():
    from shimrt import backends
    for backend in backends.NAMES:
        for part, protocol in backends.PARTS.items():
            module = importlib.import_module(f"shimrt.{backend}.{part}")
            assert set(backends.members(protocol)) <= set(module.__all__), (backend, part)


def python_blocks() -> dict[str, str]:
    """The README's and docs' Python code blocks (what users copy), each as a file of its own."""
    out = {}
    for page in [TOP / "README.md", *sorted((TOP / "docs").glob("*.md"))]:
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
            out[f"{page.relative_to(TOP).as_posix()}#{i}"] = block
    return out


def test_shimrt_scripts_and_examples_use_only_interfaces():
    files = {p.relative_to(TOP).as_posix(): p.read_text() for d in ("shimrt", "scripts", "examples")
             for p in sorted((TOP / d).rglob("*.py"))}
    assert violations(files) == []


def test_the_readme_and_docs_use_only_interfaces():
    blocks = python_blocks()
    assert len(blocks) >= 5  # the README's own examples are among them
    assert violations(blocks) == []


def test_the_check_sees_each_kind_of_use():
    """What the check above reports, on a module written to break the rule each way."""
    source = ("from shimrt.torch.policies import kept_sms\n"
              "from shimrt.nccl import library\n"
              "import shimrt.torch.trials as trials\n"
              "import shimrt\n"
              "x = library.candidates, library.load\n"
              "y = trials.SIGNIFICANCE\n"
              "z = shimrt.torch.training.LEAD_STEPS\n"
              "from shimrt.nccl import group\n"
              "w = group.settle\n")
    got = [(line, f"{m}.{n}") for line, m, n in uses(ast.parse(source), "")]
    assert sorted(got) == [(1, "shimrt.torch.policies.kept_sms"), (5, "shimrt.nccl.library.candidates"),
                           (5, "shimrt.nccl.library.load"), (6, "shimrt.torch.trials.SIGNIFICANCE"),
                           (7, "shimrt.torch.training.LEAD_STEPS"), (8, "shimrt.nccl.group")]
    # shimrt.nccl's __init__ binds group (a function) over its submodule: a name of shimrt.nccl, not a module
    found = violations({"scripts/user.py": source})
    assert sorted(f.split(": ", 1)[1].removesuffix(" is not in its __all__") for f in found) == [
        "shimrt.nccl.library.candidates", "shimrt.torch.policies.kept_sms", "shimrt.torch.training.LEAD_STEPS",
        "shimrt.torch.trials.SIGNIFICANCE"]
