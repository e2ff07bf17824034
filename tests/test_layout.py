"""docs/layout.md, the map of the package, against the tree: every module under shimrt/ is named
in the paragraph of its package (the core's anywhere), so that the map cannot fall behind."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = (ROOT / "docs" / "layout.md").read_text()
#: The paragraph that maps each subpackage: the bullet naming it.
BULLETS = {"nccl": "**Collectives**", "launch": "**Processes**", "overlap": "**Overlap**", "torch": "**torch**",
           "bench": "**Commands**", "selftest": "**Commands**", "cuda": "**The backends**",
           "hip": "**The backends**"}


def _bullet(title: str) -> str:
    """The bullet of docs/layout.md that starts with ``title``, up to the next bullet or heading."""
    match = re.search(r"^- " + re.escape(title) + r".*?(?=^- |^#|\Z)", LAYOUT, re.M | re.S)
    assert match, f"docs/layout.md has no bullet {title}"
    return match.group(0)


def test_every_module_is_named_in_its_packages_paragraph():
    unnamed = []
    for path in sorted((ROOT / "shimrt").rglob("*.py")):
        rel = path.relative_to(ROOT / "shimrt")
        if path.name in ("__init__.py", "__main__.py"):
            continue  # a package's own: its folder is what the map names
        package = rel.parts[0] if len(rel.parts) > 1 else None
        where = LAYOUT if package is None else _bullet(BULLETS[package])
        if f"`{path.name}`" not in where and not re.search(rf"`[^`]*\b{re.escape(path.name)}`", where):
            unnamed.append(str(rel))
    assert not unnamed, f"docs/layout.md does not name, in their package's paragraph: {unnamed}"


def test_every_subpackage_has_its_paragraph():
    packages = sorted(p.name for p in (ROOT / "shimrt").iterdir() if (p / "__init__.py").exists())
    assert set(packages) <= set(BULLETS), f"a subpackage without a paragraph in docs/layout.md: {packages}"
    for package, title in BULLETS.items():
        assert f"shimrt/{package}/" in _bullet(title), (package, title)


def test_the_map_names_no_file_that_is_gone():
    named = set(re.findall(r"`(?:[\w/]*/)?(\w+\.py)`", LAYOUT))
    present = {p.name for folder in ("shimrt", "tests", "examples", "scripts") for p in (ROOT / folder).rglob("*.py")}
    assert named <= present, sorted(named - present)
