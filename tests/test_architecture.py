"""The module map holds: imports run one way, no cycles, no reaching into private helpers.

model (keras_txl/*)  <-  keras_txl.training, keras_txl.export  <-  keras_txl.cli
Read from the source with `ast`, every import counted (lazy ones inside functions too).
"""

import ast
import importlib.util

from testing import REPO

# Repository folder -> installed package (pyproject.toml's package-dir).
PACKAGES = {"keras_txl": "keras_txl", "training": "keras_txl.training", "export": "keras_txl.export"}
CLI = {"keras_txl.cli", "keras_txl.__main__"}


def modules():
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((REPO / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    return found


def imports(path, name):
    """[(imported module, imported names)] of one file, relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.stem == "__init__" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.append((base, [alias.name for alias in node.names]))
    return out


def graph():
    known = modules()
    edges = {}
    for name, path in known.items():
        targets = set()
        for module, names in imports(path, name):
            for candidate in [module] + [f"{module}.{n}" for n in names]:
                if candidate in known and candidate != name:
                    targets.add(candidate)
        edges[name] = targets
    return edges


def layer(name):
    if name in CLI:
        return "cli"
    for sub in ("keras_txl.training", "keras_txl.export"):
        if name == sub or name.startswith(sub + "."):
            return sub
    return "model"


def test_the_repository_folders_map_to_modules():
    # The checks below see every module, under the name it is imported by:
    # Python finds each one at the file the checker read.
    found = modules()
    assert {"keras_txl.causal_lm", "keras_txl.tokenizers", "keras_txl.training.loop",
            "keras_txl.export.saved_model", "keras_txl.export.generation", "keras_txl.cli"} <= set(found)
    for name, path in found.items():
        assert importlib.util.find_spec(name).origin == str(path), name


def test_imports_run_one_way():
    allowed = {"model": {"model"},
               "keras_txl.training": {"model", "keras_txl.training"},
               "keras_txl.export": {"model", "keras_txl.export"},
               "cli": {"model", "keras_txl.training", "keras_txl.export", "cli"}}
    wrong = [(a, b) for a, targets in graph().items() for b in targets
             if layer(b) not in allowed[layer(a)]]
    assert not wrong, wrong


def test_no_import_cycles():
    edges = graph()
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    # The package's own __init__ loads its names lazily and is imported by everything.
    cycles = [c for c in cycles if "keras_txl" not in c]
    assert not cycles, cycles


def test_no_module_imports_another_modules_private_names():
    known = modules()
    reached = []
    for name, path in known.items():
        for module, names in imports(path, name):
            if module in known and module != name:
                reached.extend((name, module, n) for n in names
                               if n.startswith("_") and not n.startswith("__"))
    assert not reached, reached


def test_the_checker_sees_a_violation(tmp_path):
    # The checks above would fail on the layouts they forbid.
    path = tmp_path / "fake.py"
    path.write_text("def f():\n    from keras_txl.training import loop\n    from ..io import _x\n")
    assert ("keras_txl.training", ["loop"]) in imports(path, "keras_txl.generation")
    assert ("keras_txl.io", ["_x"]) in imports(path, "keras_txl.export.fake")
    assert layer("keras_txl.generation") == "model" and layer("keras_txl.training.loop") != "model"
