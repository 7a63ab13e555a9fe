"""The import graph follows DESIGN.md's layers: no cycles between modules or sakura_core packages, and nothing but
the CLI imports the benchmark package."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sakura_core", "cloud_server", "android_bridge", "nodes")
# sakura_core's layers, top to bottom: a package may import only packages listed after it (or top-level modules).
LAYERS = ["demo", "precompute", "runtime", "policy", "fetch", "kv", "models"]


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges = defaultdict(set)
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges[name].update(t for t in targets if t in mods and t != name)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def test_no_module_import_cycles():
    assert _cycles(_edges(_modules())) == []


def test_sakura_core_packages_import_only_downwards():
    edges = _edges(_modules())
    bad = []
    for a, targets in edges.items():
        pa = a.split(".")
        if pa[0] != "sakura_core" or len(pa) < 3 or pa[1] not in LAYERS:
            continue
        for b in targets:
            pb = b.split(".")
            if pb[0] == "sakura_core" and len(pb) >= 3 and pb[1] in LAYERS and pb[1] != pa[1]:
                if LAYERS.index(pb[1]) < LAYERS.index(pa[1]):
                    bad.append(f"{a} -> {b}")
    assert bad == []


def test_only_the_cli_imports_the_benchmark_package():
    edges = _edges(_modules())
    importers = sorted(
        a
        for a, targets in edges.items()
        if not a.startswith("sakura_core.bench") and any(t.startswith("sakura_core.bench") for t in targets)
    )
    assert importers == []
