"""The layering of DESIGN.md, enforced: import-linter's contracts (``[tool.importlinter]`` in
pyproject.toml) hold on the package, fail on a deliberate upward import, and no module of
multidraft imports itself through a circle of imports (lazy imports inside functions count)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

import multidraft

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")  # import-linter, the `dev` extra


def _lint(src: Path, config: Path, cwd: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the ``multidraft`` package found in ``src`` (and only there)."""
    assert LINT_IMPORTS.is_file(), f"{LINT_IMPORTS} missing: pip install -e '.[dev]' (import-linter)"
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache", "--no-logo"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_every_contract_is_kept():
    res = _lint(SRC, ROOT / "pyproject.toml", ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout and "BROKEN" not in res.stdout, res.stdout
    for name in ("imports point down the floors of DESIGN.md", "pure maths imports no model library",
                 "only decoding imports llama_cpp",
                 "the --tree auto choice knows neither the study files nor the command line",
                 "the decode settings and the draft sources are model-free", "the decoder's step knows no decode loop"):
        assert f"{name} KEPT" in res.stdout, res.stdout


@pytest.mark.parametrize("module, line, contract, shown", [
    # a floor-of-maths module reaching up to the decoder
    ("drafts.py", "from multidraft.decoding import pair as _upward", "imports point down the floors of DESIGN.md",
     "multidraft.drafts -> multidraft.decoding.pair"),
    # two packages of one floor importing each other
    ("models/gguf.py", "from multidraft import datasets as _sideways", "imports point down the floors of DESIGN.md",
     "multidraft.models.gguf -> multidraft.datasets"),
    # llama.cpp outside decoding/
    ("models/gguf.py", "import llama_cpp as _engine", "only decoding imports llama_cpp",
     "multidraft.models.gguf -> llama_cpp"),
    # the model-free settings reaching for a model runner
    ("decoding/settings.py", "from multidraft.decoding import runners as _runners",
     "the decode settings and the draft sources are model-free", "multidraft.decoding.settings -> multidraft.decoding.runners"),
    # the step reaching up to its decode loop
    ("decoding/step.py", "from multidraft.decoding import batch as _loop", "the decoder's step knows no decode loop",
     "multidraft.decoding.step -> multidraft.decoding.batch"),
])
def test_a_deliberate_violation_breaks_its_contract(tmp_path, module, line, contract, shown):
    copy = tmp_path / "src"
    shutil.copytree(SRC / "multidraft", copy / "multidraft", ignore=shutil.ignore_patterns("__pycache__"))
    config = tmp_path / "pyproject.toml"
    shutil.copyfile(ROOT / "pyproject.toml", config)
    target = copy / "multidraft" / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}  # deliberate violation\n", encoding="utf-8")
    res = _lint(copy, config, tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{contract} BROKEN" in res.stdout, res.stdout
    assert shown in res.stdout, res.stdout


def import_cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing
    itself) of the graph ``module -> modules it imports`` (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(imports.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1 or node in imports.get(node, ()):
                    cycles.append(sorted(component))
    return cycles


def test_the_cycle_search_finds_cycles():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"a"}, "b": {"c"}, "c": {"b", "d"}, "d": set()}) == [["a"], ["b", "c"]]


def test_no_import_cycles_between_modules():
    assert Path(multidraft.__file__).resolve().parent == SRC / "multidraft"  # this checkout's package
    graph = grimp.build_graph("multidraft", cache_dir=None)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert len(imports) > 50 and "multidraft.decoding.pair" in imports["multidraft.cli._args"]  # (the load boundary)
    assert import_cycles(imports) == []
