"""The import graph follows docs/design.md's layers: no cycles between modules or sakura_core packages, nothing but the
CLI imports the benchmark package, and neither the nodes nor the core (but its demo and benchmarks) import the
server. One home per concept: the names of ``ONE_HOME`` are defined in exactly one module, no regular expression is
compiled in two; functions stay within 80 lines."""

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


# ---- one home per concept (issue 23) ---------------------------------------------------------------------------
#: Concepts written once: each name is defined (def, class or module-level assignment) in exactly one module of the
#: packages; everyone else imports it.
ONE_HOME = (
    "edit_times",  # the edit's schedule, model-aware (a latent klein folder has its own shifted sigmas)
    "flow_timesteps",  # the flow schedule edit_times falls back to
    "check_schedule",  # a per-step template's schedule against the edit's
    "ScheduleMismatchError",
    "Manifest",  # the typed manifest, parsed once
    "parse_manifest",  # the manifest validation
    "check_references",  # the manifest's references (a template's reference images), in the one schema
    "Reference",
    "Shard",  # the manifest's typed leaves (kv/manifest_leaves.py), built by the parse only
    "Representation",
    "CrossStepRef",
    "PlannedRep",  # a representation as a fetch plan serves it (policy/ladder.py)
    "as_manifest",
    "grids_of",  # the references' token layout (token_grid + rope_layout)
    "validate_manifest",
    "manifest_kv_mode",
    "ManifestError",
    "ModelMismatchError",
    "MANIFEST_VERSION",
    "KV_MODES",
    "TEMPLATE_ID_RE",  # the template-id pattern
    "DIGEST_RE",
    "MODEL_ID_RE",
    "validate_template_id",
    "validate_digest",
    "check_template",  # a template against the model
    "runnable_policy",  # a policy name an edit can run
    "is_loopback",  # the loopback test
    "bearer_token",  # the bearer check
    "token_matches",
    "ShardSource",
    "TemplateSource",
    "ServerSource",
    "StoreSource",
    "StoreReader",  # the store's on-disk layout, read side
    "SOURCE_IMAGE_EXTS",
)
#: Names of the second homes that were removed: defining one again brings the duplicate back.
RETIRED = ("_is_loopback", "_bearer", "_token_ok", "check_manifest", "check_request_schedule", "_TEMPLATE_ID_RE")


def _definitions() -> dict[str, set[str]]:
    """Module-level definitions (def, class, assignment; not class members): name -> the modules defining it."""
    out: dict[str, set[str]] = defaultdict(set)
    for name, path in _modules().items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out[node.name].add(name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for t in ast.walk(target):
                        if isinstance(t, ast.Name):
                            out[t.id].add(name)
    return out


def test_no_concept_is_defined_twice():
    defs = _definitions()
    homes = {name: sorted(defs.get(name, ())) for name in ONE_HOME}
    assert {name: mods for name, mods in homes.items() if len(mods) != 1} == {}
    assert {name: sorted(defs[name]) for name in RETIRED if name in defs} == {}


def test_no_regular_expression_is_compiled_in_two_modules():
    """A pattern (the template id, a digest, ...) is compiled once and imported."""
    where: dict[str, set[str]] = defaultdict(set)
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        strings = {  # module-level string constants, for re.compile(NAME)
            t.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for t in node.targets
            if isinstance(t, ast.Name) and isinstance(node.value.value, str)
        }
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "compile"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re"
                and node.args
            ):
                continue
            arg = node.args[0]
            pattern = arg.value if isinstance(arg, ast.Constant) else strings.get(getattr(arg, "id", None))
            if isinstance(pattern, str):
                where[pattern].add(name)
    assert {pattern: sorted(mods) for pattern, mods in where.items() if len(mods) > 1} == {}


def test_nodes_and_the_core_never_import_the_server():
    """nodes/ and sakura_core (but its demo and benchmark packages) reach a store through sakura_core.fetch."""
    edges = _edges(_modules())
    bad = sorted(
        f"{a} -> {b}"
        for a, targets in edges.items()
        if a.split(".")[0] == "nodes"
        or (a.split(".")[0] == "sakura_core" and not a.startswith(("sakura_core.demo", "sakura_core.bench")))
        for b in targets
        if b.split(".")[0] == "cloud_server"
    )
    assert bad == []


MAX_FUNCTION_LINES = 80


def test_no_function_is_over_80_lines():
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert sorted(long) == []
