"""Library code does not print: outside ``cli/`` and ``experiments/`` (the faces that own stdout)
no module of ``multidraft`` calls ``print``; it logs through ``logging`` (the server's request
lines go to ``multidraft.serve.requests``). Checked on the source text (``ast``)."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "multidraft"
PRINTING = ("cli", "experiments")


def prints(source: str) -> list[int]:
    """The lines of ``source`` that call ``print``."""
    return [n.lineno for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]


def test_library_code_does_not_print():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if path.relative_to(PKG).parts[0] in PRINTING:
            continue
        found += [f"{path.relative_to(PKG)}:{line}" for line in prints(path.read_text())]
    assert found == []


def test_a_print_is_found():
    assert prints("import sys\n\ndef f():\n    print('x', file=sys.stderr)\n") == [4]
    assert prints("log = print\nx.print('not the builtin')\n") == []
