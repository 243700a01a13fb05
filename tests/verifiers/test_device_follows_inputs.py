"""Ready for a GPU (issue 27, item 6): no tensor is created on the CPU by default inside the
verifiers and the tree rules, so every rule runs on CUDA tensors unchanged.

There is no GPU in CI, and the 'meta' device cannot run the rules (they branch on values:
``bool(tensor)``, ``int(tensor)``), so the check is static and exhaustive: every call of a
torch factory (``zeros``, ``ones``, ``empty``, ``full``, ``arange``, ``tensor``, ``as_tensor``,
``rand``, ``randn``, ``randint``, ``randperm``, ``eye``, ``linspace``, ``triu_indices``,
``tril_indices``, ``Generator``) in ``src/multidraft/verifiers/*.py`` and in every
``src/multidraft/trees`` module that registers a tree rule passes ``device=``. ``*_like``
factories follow their argument and are fine. The few exceptions are listed below with the
reason (host-side integer constants). A test that can fail: it is run on a snippet that
forgets ``device=`` too.
"""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "multidraft"
FACTORIES = {"zeros", "ones", "empty", "full", "arange", "tensor", "as_tensor", "rand", "randn", "randint", "randperm",
             "eye", "linspace", "triu_indices", "tril_indices", "Generator", "from_numpy"}
# (file, line text fragment) -> why a CPU tensor is right there
ALLOWED = {
    ("khisti_is.py", "_R_LO = int(torch.tensor("): "a module constant read back as a Python int",
    ("khisti_is.py", "return (int(torch.ones((), dtype=dtype).view(itype))"): "a Python int (the bucket count)",
}
# tree modules that register a rule but are small-V references that solve on the CPU by design
TREE_SKIP = {"ceiling.py": "tree_lp: an LP over whole trees at small V, solved by scipy on the CPU"}


def rule_files() -> list[Path]:
    files = sorted((SRC / "verifiers").glob("*.py"))
    for f in sorted((SRC / "trees").glob("*.py")):
        if f.name not in TREE_SKIP and "register(" in f.read_text() and f.name != "rules.py":
            files.append(f)
    return files


def violations(text: str, name: str) -> list[str]:
    out = []
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "as_generator":  # a seed's generator must live with the rows
            if len(node.args) < 2 and not any(k.arg == "device" for k in node.keywords):
                out.append(f"{name}:{node.lineno}: as_generator(...) without a device: a seed would give a CPU generator")
            continue
        if not (isinstance(f, ast.Attribute) and f.attr in FACTORIES and isinstance(f.value, ast.Name) and f.value.id == "torch"):
            continue
        line = lines[node.lineno - 1]
        if any(name == fn and frag in line for fn, frag in ALLOWED):
            continue
        if f.attr == "from_numpy":  # always a CPU tensor: it must be moved (torch.as_tensor(x, device=...))
            out.append(f"{name}:{node.lineno}: torch.from_numpy makes a CPU tensor; use torch.as_tensor(..., device=)")
            continue
        if not any(k.arg == "device" for k in node.keywords):
            out.append(f"{name}:{node.lineno}: torch.{f.attr}(...) without device=: {line.strip()}")
    return out


def test_every_factory_call_in_the_rules_names_a_device():
    files = rule_files()
    assert any(f.name == "specinfer.py" for f in files) and any(f.name == "walk.py" for f in files)
    bad = [v for f in files for v in violations(f.read_text(), f.name)]
    assert not bad, "\n".join(bad)


def test_the_check_catches_a_missing_device():
    snippet = "import torch\ndef f(p, g):\n    u = torch.rand(3, generator=g, dtype=torch.float64)\n" \
              "    z = torch.zeros(2, device=p.device)\n    return torch.full_like(z, 1.0), torch.Generator()\n"
    bad = violations(snippet + "    h = as_generator(3, purpose='verify')\n", "x.py")
    assert len(bad) == 3, bad
    assert {b.split(":")[1] for b in bad} == {"3", "5", "6"}, bad


def test_the_allowed_exceptions_still_exist():
    # an exception that no longer matches a line would hide nothing: keep the list honest
    for fn, frag in ALLOWED:
        assert frag in (SRC / "verifiers" / fn).read_text(), (fn, frag)
