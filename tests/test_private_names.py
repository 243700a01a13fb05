"""No private name crosses a room: a module of one package of ``multidraft`` (a room: ``decoding``,
``experiments``, ``serve``, ``cli``, ...) imports no ``_name`` from another room, and the faces
(``experiments``, ``serve``, ``cli``) read no private attribute of another object (``x._y`` where x
is not ``self`` or ``cls``). Shared private helpers of the package root (``multidraft._validate``,
``_errors``, ``_optional``, ``_alloc``, ``_scan``: modules whose whole name is private, meant for
every room) may be imported by name; their own private names may not.

Checked on the source text (``ast``), so it fails on a deliberate violation (tested below)."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "multidraft"
FACES = ("experiments", "serve", "cli")
# public attributes that begin with an underscore by their libraries' conventions: a namedtuple's
# methods, torch's tensor version counter, the interpreter's frame access
LIBRARY_NAMES = {"_asdict", "_replace", "_fields", "_make", "_version", "_getframe"}


def _room(module: str) -> str:
    """The room of a dotted module name below multidraft ('decoding' for multidraft.decoding.engine;
    a top-level module is its own room)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _module_name(path: Path, pkg: Path) -> str:
    rel = path.relative_to(pkg.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, here: str, is_pkg: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = here.split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def violations(pkg: Path = PKG) -> list[str]:
    out = []
    for path in sorted(pkg.rglob("*.py")):
        here = _module_name(path, pkg)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        room = _room(here)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                src = _resolve(node, here, path.name == "__init__.py")
                if not src.startswith("multidraft"):
                    continue
                src_room = _room(src)
                for alias in node.names:
                    full = f"{src}.{alias.name}"
                    target_room = src_room if src != "multidraft" else alias.name
                    if target_room == room:
                        continue
                    if _private(alias.name) and not (src == "multidraft" and "." not in alias.name):
                        out.append(f"{here}:{node.lineno} imports {full} (a private name of {target_room})")
                    elif any(_private(p) for p in src.split(".")[2:]):
                        out.append(f"{here}:{node.lineno} imports from {src} (a private module of {src_room})")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "multidraft" and _room(alias.name) != room and any(_private(p) for p in parts[2:]):
                        out.append(f"{here}:{node.lineno} imports {alias.name} (a private module)")
            elif isinstance(node, ast.Attribute) and room in FACES and _private(node.attr):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if node.attr in LIBRARY_NAMES:
                    continue
                out.append(f"{here}:{node.lineno} reads .{node.attr} of another object")
    return out


def test_no_private_name_crosses_a_room():
    assert violations() == []


def test_a_deliberate_violation_is_found(tmp_path):
    pkg = tmp_path / "multidraft"
    (pkg / "experiments").mkdir(parents=True)
    (pkg / "decoding").mkdir()
    for d in (pkg, pkg / "experiments", pkg / "decoding"):
        (d / "__init__.py").write_text("")
    (pkg / "decoding" / "engine.py").write_text("def _step():\n    pass\n")
    (pkg / "experiments" / "bad.py").write_text(
        "from ..decoding.engine import _step\nfrom multidraft._validate import as_int\n"
        "def f(dec):\n    return dec._pos, self_ok()\n")
    found = violations(pkg)
    assert any("imports multidraft.decoding.engine._step" in v for v in found), found
    assert any("reads ._pos" in v for v in found), found
    assert not any("_validate" in v for v in found), found
