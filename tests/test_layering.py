"""The import graph follows docs/design.md's layers: no cycles between modules or sakura_core packages, the product
never imports the tools (``sakura_tools``: benchmarks, test servers, demo training; only the CLI's command table names
their modules, as strings it loads when one runs), and neither the nodes nor the core (but its demo) import the
server. One home per concept: the names of ``ONE_HOME`` are defined in exactly one module, no regular expression is
compiled in two; functions stay within 80 lines; constructors in runtime/ and policy/ take at most 8 parameters; at
most 50 ``# fmt: skip`` markers, each saying why."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sakura_core", "cloud_server", "android_bridge", "nodes", "sakura_tools")
PRODUCT = ("sakura_core", "cloud_server", "android_bridge", "nodes")  # all but the tools
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


def test_the_product_never_imports_the_tools():
    edges = _edges(_modules())
    importers = sorted(
        f"{a} -> {t}"
        for a, targets in edges.items()
        if a.split(".")[0] in PRODUCT
        for t in targets
        if t.split(".")[0] == "sakura_tools"
    )
    assert importers == []


def _module_strings(path: Path, mods: dict[str, Path]) -> set[str]:
    """String constants of ``path`` that are exactly a module name of the repository (a lazy import's target)."""
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in mods
    }


def test_only_the_cli_table_names_a_tools_module():
    """A module name as a string is an import waiting to happen (``importlib.import_module``): in the product only
    ``sakura_core.cli``'s command table holds tools' names, each loaded when its command runs."""
    mods = _modules()
    named = {
        name: sorted(s for s in _module_strings(path, mods) if s.startswith("sakura_tools."))
        for name, path in mods.items()
        if name.split(".")[0] in PRODUCT
    }
    assert {name: found for name, found in named.items() if found and name != "sakura_core.cli"} == {}
    assert len(named["sakura_core.cli"]) >= 10  # the checks see the table (bench, train, eval)


def test_the_benchmark_package_is_a_leaf_of_the_tools():
    """Nothing imports ``sakura_tools.bench`` but itself (the CLI loads its commands by name)."""
    edges = _edges(_modules())
    importers = sorted(
        a
        for a, targets in edges.items()
        if not a.startswith("sakura_tools.bench") and any(t.startswith("sakura_tools.bench") for t in targets)
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
    "EditSettings",  # the edit's one settings object (sakura_core/edit_settings.py)
    "FetchSettings",
    "EditRequest",
    "OpenedTemplate",
    "is_loopback",  # the loopback test
    "bearer_token",  # the bearer check
    "token_matches",
    "ShardSource",
    "TemplateSource",
    "ServerSource",
    "StoreSource",
    "StoreReader",  # the store's on-disk layout, read side
    "SOURCE_IMAGE_EXTS",
    # the lanes' protocol, one home for the live lanes and the simulator (runtime/lane_rules.py, runtime/deferral.py)
    "LaneConfig",  # the lanes' settings (RuntimeConfig and SimConfig extend it)
    "LaneResult",  # what a live and a simulated run both report
    "ask_in_order",  # the in-order base ask
    "ask_deferred",  # deferred shards asked again
    "has_prefetch_room",  # the prefetch-budget room check
    "link_passed",  # a shard the link went past: fetched at the floor when the compute lane needs it
    "ask_upgrade",  # upgrades on the idle link
    "ask_reroot_chain",  # the re-root chain fetched before a shard at its floor
    "pass_makes",  # the layers a fallback template pass keeps
    "pass_stops_after",  # when the fallback pass stops
    "pass_can_stop",
    "ahead_window_bytes",  # how far requests go ahead of the wire
    "request_gate",  # whether the next request may go ahead now
    "prefetch_room",  # the prefetch-budget room check, with its reason
    "ask_keep_template",  # the split, not asked at a shard the policy computes for good
    "late_recheck_s",  # a late shard's waits: asked at the wait's start, then every cached-layer time
    "late_wait_until",
    "late_gives_up",  # ... and given up on after shard_wait_s
    "RECHECK_MIN_S",
    "drop_made",  # a shard a fallback pass made leaves the deferred and asked-for shards
    "decode_span",  # a landed shard's decode: the ready time the policy sees
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
    """nodes/ and sakura_core (but its demo package) reach a store through sakura_core.fetch."""
    edges = _edges(_modules())
    bad = sorted(
        f"{a} -> {b}"
        for a, targets in edges.items()
        if a.split(".")[0] == "nodes" or (a.split(".")[0] == "sakura_core" and not a.startswith("sakura_core.demo"))
        for b in targets
        if b.split(".")[0] == "cloud_server"
    )
    assert bad == []


MAX_MODULE_LINES = 400


def test_no_module_is_over_400_lines():
    """A module holds one concern: past 400 lines (after `make format`) it holds more; split it along a seam."""
    long = {
        name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, "split these modules along a seam (one concern each)"


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


# ---- constructors of a handful of named parts (issue 51) --------------------------------------------------------
MAX_INIT_PARAMETERS = 8
#: Where the rule holds: a run's lanes, the simulator and the policies.
INIT_RULE_PACKAGES = ("sakura_core.runtime", "sakura_core.policy")
#: Records still over the limit, each with why it is left (issue 51's target: none left). Remove an entry once its
#: class is within the limit: the test fails on an entry that no longer needs it.
INIT_PENDING: dict[str, str] = {}


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if (target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)) == "dataclass":
            return True
    return False


def _field_count(node: ast.ClassDef) -> int:
    """The parameters of a dataclass's generated ``__init__`` its own body adds: annotated fields, less ``ClassVar``s,
    ``KW_ONLY`` markers and ``field(init=False)``."""
    n = 0
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        annotation = ast.unparse(item.annotation)
        if "ClassVar" in annotation or annotation.endswith("KW_ONLY"):
            continue
        value = item.value
        if isinstance(value, ast.Call) and any(
            k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in value.keywords
        ):
            continue
        n += 1
    return n


def _init_parameters() -> dict[str, int]:
    """Per class of the rule's packages: its ``__init__``'s parameters (``self`` excluded), the explicit one's or a
    dataclass's generated one's (the fields of dataclass bases of the same packages included)."""
    classes: dict[str, tuple[ast.ClassDef, str]] = {}
    for name, path in _modules().items():
        if name.startswith(INIT_RULE_PACKAGES):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    classes[f"{name}.{node.name}"] = (node, name)
    by_short = defaultdict(list)
    for qual, (node, _) in classes.items():
        by_short[node.name].append(qual)

    def count(qual: str) -> int | None:
        node, _ = classes[qual]
        init = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)
        if init is not None:
            a = init.args
            return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg) - 1
        if not _is_dataclass(node):
            return None
        inherited = 0
        for base in node.bases:
            if isinstance(base, ast.Name) and len(by_short[base.id]) == 1:
                inherited += count(by_short[base.id][0]) or 0
        return inherited + _field_count(node)

    return {qual: n for qual in classes if (n := count(qual)) is not None}


def test_no_constructor_takes_over_8_parameters():
    counts = _init_parameters()
    over = {qual: n for qual, n in counts.items() if n > MAX_INIT_PARAMETERS and qual not in INIT_PENDING}
    assert over == {}, "group them into named parts (runtime/lane_parts.py: LaneParts, EditInputs, RunControls)"
    stale = {qual for qual in INIT_PENDING if counts.get(qual, 0) <= MAX_INIT_PARAMETERS}
    assert stale == set(), "these are within the limit now: remove them from INIT_PENDING"


def test_the_parameter_count_sees_explicit_and_generated_constructors():
    counts = _init_parameters()
    assert counts["sakura_core.runtime.lane_parts.LaneParts"] == 8  # a dataclass: its fields
    assert counts["sakura_core.runtime.live_state.LiveState"] == 7  # an explicit __init__, keyword-only included
    assert counts["sakura_core.runtime.lane_parts.EditInputs"] == 5  # fields with defaults counted
    assert counts["sakura_core.runtime.lane_parts.RunControls"] == 3


MAX_FMT_SKIP = 50


def test_at_most_50_fmt_skip_markers_each_with_its_reason():
    """``ruff format`` lays the code out; a ``# fmt: skip`` stays only where the hand layout carries meaning."""
    from format_repo import count_markers, python_files

    found = count_markers(python_files(ROOT))
    total = sum(len(lines) for lines in found.values())
    assert total <= MAX_FMT_SKIP, f"{total} `# fmt: skip` markers (at most {MAX_FMT_SKIP}): run make format"
    bare = [f"{Path(p).relative_to(ROOT)}:{line}" for p, lines in found.items() for line, why in lines if not why]
    assert bare == [], "markers without `# keep: <why>`: run make format (tests/support/format_repo.py)"


def test_the_formatter_script_strips_only_bare_markers_in_comments():
    from format_repo import strip_markers

    source = (
        "x = f(1,\n      2)  # fmt: skip\n"
        "y = [1,  2]  # fmt: skip # keep: aligned table\n"
        "z = g(3)  # fmt: skip  (downsamples 2x)\n"
        's = "# fmt: skip"\n'
    )
    assert strip_markers(source) == (
        "x = f(1,\n      2)\n"
        "y = [1,  2]  # fmt: skip # keep: aligned table\n"
        "z = g(3)  # (downsamples 2x)\n"
        's = "# fmt: skip"\n'
    )
    assert strip_markers(strip_markers(source)) == strip_markers(source)
