"""The phone page decodes like Python, bit for bit: the conformance vectors (``vectors.py``: golden shards of every
codec level and family, bad ones of every kind) decoded by ``phone_web/src`` under node, against Python's decoded
float16 and Python's error classes; a decoder with one rounding changed fails; the page's shared numbers are
generated from sakura_core. The page's fetch-lane gates (``gate_vectors.py``: the request-ahead window and gate, the
prefetch room, as the simulator asks them over synthetic links) answer as Python's on every case, every reason
present; a gate with one comparison or constant changed fails."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zstandard
from ci_deps import require_or_skip

from sakura_core.kv import web_constants
from sakura_core.kv.container import parse_shard
from sakura_core.kv.sakura_decode import WIDTHS, meta_size

from .gate_vectors import GATE_FILE, write_gate_vectors
from .manifest_vectors import write_manifest_vectors
from .vectors import write_vectors

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "phone_web"
NODE = shutil.which("node")
FZSTD = WEB / "node_modules" / "fzstd" / "package.json"


def _need_node() -> None:
    require_or_skip(NODE is not None, "node is not installed (apt-get install nodejs npm)")
    require_or_skip(FZSTD.exists(), "phone_web's npm packages are not installed (make test runs `npm ci` there)")


@pytest.fixture(scope="module")
def vectors(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("vectors")
    index = write_vectors(out)
    return out, {**index, "manifests": write_manifest_vectors(out)["cases"]}


def _run(web: Path, vector_dir: Path, runner: str = "run_vectors.mjs") -> tuple[int, dict, list[dict]]:
    """Run one of the page's vector runners from ``web`` (a phone_web folder); (exit code, summary, failures)."""
    proc = subprocess.run(
        [NODE, str(web / "test" / runner), str(vector_dir)], capture_output=True, text=True, timeout=300, cwd=web
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines and "summary" in lines[-1], f"runner printed no summary: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    return proc.returncode, lines[-1], lines[:-1]


def test_the_page_constants_are_generated_from_sakura_core():
    text = (ROOT / web_constants.WEB_CONSTANTS_PATH).read_text(encoding="utf-8")
    assert text == web_constants.render_constants_module(), (
        "phone_web/src/format_constants.js is stale: run `python -m sakura_core.kv.web_constants`"
    )
    c = web_constants.format_constants()
    assert c["limits"]["MAX_REPRESENTATIONS"] == 64 and c["container"]["MAX_ELEMENTS"] == 1 << 28
    assert c["sakura"]["WIDTHS"] == list(WIDTHS) and len(c["sakura"]["SPAN_F32_BITS"]) == 256


def test_the_page_error_classes_mirror_python():
    """Same names, same parents: a page catching ShardFormatError (or ShardCorruptError) catches what Python's
    caller would."""
    _need_node()
    from sakura_core.fetch import errors as fetch_errors
    from sakura_core.kv import binding, chain, container, manifest_limits, manifest_schema

    script = (
        "import('./src/errors.js').then(m => console.log(JSON.stringify(Object.fromEntries(Object.entries(m)"
        ".filter(([, c]) => typeof c === 'function' && c.prototype instanceof Error)"
        ".map(([n, c]) => [n, Object.getPrototypeOf(c).name])))))"
    )
    proc = subprocess.run(
        [NODE, "--input-type=module", "-e", script], capture_output=True, text=True, cwd=WEB, timeout=60, check=True
    )
    js = json.loads(proc.stdout)
    python = {}
    for module in (container, chain, binding, manifest_schema, manifest_limits, fetch_errors):
        for name in dir(module):
            cls = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, Exception) and name in js:
                python[name] = cls.__mro__[1].__name__
    python["JSONValueError"] = "Error"  # Python raises a plain ValueError there
    assert set(python) == set(js) and len(js) >= 15
    mismatched = {
        n: (js[n], python[n])
        for n in js
        if js[n] != python[n].replace("ValueError", "Error").replace("Exception", "Error")
    }
    assert mismatched == {}


def test_vectors_cover_every_level_family_and_error_class(vectors):
    _, index = vectors
    cases = index["cases"]
    names = {c["name"] for c in cases}
    for j in range(9):  # every SAKURA level, as a chain and as a direct blob, on every geometry
        for g in ("g1", "g2", "g3", "g4"):
            assert {f"{g}/sakura-l{j}/chain", f"{g}/sakura-l{j}/direct"} <= names
    golden = {c["family"] for c in cases if "error" not in c["expect"]}
    assert golden >= {"fp16", "int8", "int4", "cachegen", "sakura", "residual", "closed", "reuse", "slot"}
    errors = {c["expect"]["error"] for c in cases if "error" in c["expect"]}
    assert errors == {
        "ShardTruncatedError",
        "ShardMagicError",
        "ShardVersionError",
        "ShardCorruptError",
        "ShardOversizedError",
        "UnknownCodecError",
        "ShardChainError",
        "MissingReferenceError",
        "ShardIntegrityError",
        "ShardBindingError",
    }


def test_golden_sakura_vectors_hold_every_bit_group_size(vectors):
    """Each m = 1..8 (every packing: bits, planar 2 and 4, one symbol a byte) appears in some golden blob."""
    vector_dir, index = vectors
    w = np.array(WIDTHS)
    seen = set()
    for c in index["cases"]:
        if "error" in c["expect"] or c["family"] not in ("sakura", "residual", "closed", "slot"):
            continue
        prev = None
        for name in c["blobs"]:
            header, sections = parse_shard((vector_dir / name).read_bytes())
            if header.codec != "sakura":
                break
            n_l, _, h, d = header.tensor_shape
            skip = meta_size(n_l, h, d, header.ref_scale is not None) if prev is None else 0
            delta = np.frombuffer(zstandard.ZstdDecompressor().decompress(bytes(sections[0])), np.uint8)[skip:]
            new = delta if prev is None else prev + delta
            seen |= set((w[new] - (0 if prev is None else w[prev])).tolist()) - {0}
            prev = new
    assert seen == set(range(1, 9))


def test_the_page_decodes_every_vector_like_python(vectors):
    _need_node()
    vector_dir, index = vectors
    code, summary, failures = _run(WEB, vector_dir)
    s = summary["summary"]
    assert failures == [] and code == 0, (
        f"{s['goldenPass']}/{s['golden']} golden bit-exact, {s['badPass']}/{s['bad']} bad refused by class; "
        f"first failures: {failures[:5]}"
    )
    n_bad = sum("error" in c["expect"] for c in index["cases"])
    assert s == {
        "golden": len(index["cases"]) - n_bad,
        "goldenPass": len(index["cases"]) - n_bad,
        "bad": n_bad,
        "badPass": n_bad,
    }


def test_the_page_parses_every_manifest_like_python(vectors):
    _need_node()
    vector_dir, index = vectors
    code, summary, failures = _run(WEB, vector_dir, "run_manifests.mjs")
    s = summary["summary"]
    assert failures == [] and code == 0, (
        f"{s['validPass']}/{s['valid']} valid accepted, {s['badPass']}/{s['bad']} bad refused by class; first "
        f"differences: {failures[:5]}"
    )
    outcomes = {c["expect"] for c in index["manifests"]}
    assert outcomes == {"ok", "ManifestError", "ManifestLimitError", "ModelMismatchError", "LimitError", "ValueError"}
    assert s["valid"] + s["bad"] == len(index["manifests"]) > 3000


@pytest.mark.parametrize(
    ("path", "old", "new", "failing"),
    [  # one rounding or one error class changed: the suite must notice
        ("src/f16.js", "(rest === 0x1000 && r & 1)", "(rest === 0x1000)", "not bit-exact"),
        (
            "src/sakura_codec.js",
            "step[i] = fr(fr(hi[i] - lo[i]) / 255)",
            "step[i] = fr((hi[i] - lo[i]) / 255)",
            "crafted/sakura-range-rounding",
        ),
        (
            "src/container.js",
            "throw new ShardTruncatedError(`shard blob has ${n} bytes but its header declares",
            "throw new ShardCorruptError(`shard blob has ${n} bytes but its header declares",
            "Python raises ShardTruncatedError",
        ),
        (
            "src/manifest.js",
            'const isInt = (x) => typeof x === "number" && Number.isInteger(x);',
            "const isInt = (x) => Number.isInteger(Number(x));",
            "=float",
        ),
        ("src/manifest.js", 'atMost("heads", h.heads, L.MAX_HEADS);', "", "limit/heads-257"),
        (
            "src/cachegen.js",
            "cdf[i] = Math.trunc(cumulative * scale) + i;",
            "cdf[i] = Math.round(cumulative * scale) + i;",
            "cachegen-l",
        ),
    ],
)
def test_a_decoder_that_differs_fails_the_suite(vectors, tmp_path, path, old, new, failing):
    _need_node()
    web = tmp_path / "phone_web"
    shutil.copytree(WEB / "src", web / "src")
    shutil.copytree(WEB / "test", web / "test")
    shutil.copy(WEB / "package.json", web / "package.json")
    (web / "node_modules").symlink_to(WEB / "node_modules")
    source = (web / path).read_text()
    assert source.count(old) == 1
    (web / path).write_text(source.replace(old, new))
    code, _, failures = _run(web, vectors[0], "run_manifests.mjs" if "manifest" in path else "run_vectors.mjs")
    assert code == 1 and failures
    assert any(failing in json.dumps(f) for f in failures), failures[:3]


# every reason a gate answers with: the request-ahead gate's (deferral.request_gate), the prefetch room's
# (lane_rules.prefetch_room)
GATE_REASONS = {"probe", "within-window", "beyond-window", "no-cap", "running-step", "size-unknown", "room", "no-room"}


@pytest.fixture(scope="module")
def gate_vectors(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("gates")
    return out, write_gate_vectors(out)


def test_the_page_gates_requests_like_python(gate_vectors):
    _need_node()
    folder, counts = gate_vectors
    code, summary, diffs = _run(WEB, folder, "run_gate.mjs")
    s = summary["summary"]
    assert code == 0 and diffs == [] and s["pass"] == s["cases"] == counts["cases"], diffs[:5]
    assert counts["calls"]["gate"] >= 500 and counts["calls"]["room"] >= 500
    assert set(s["reasons"]) == set(counts["reasons"]) == GATE_REASONS


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [  # one comparison or constant of the page's gates changed: the suite must notice
        ("if (leftBytes <= window)", "if (leftBytes < window)", "beyond-window"),
        ("AHEAD_WINDOW_RTTS = 2.0", "AHEAD_WINDOW_RTTS = 2.5", "within-window"),
        ("laterBytes + shardBytes <= cap", "laterBytes + shardBytes < cap", "no-room"),
        ("if (shardBytes === null) return", "if (shardBytes === undefined) return", "size-unknown"),
    ],
)
def test_a_gate_that_differs_fails_the_suite(gate_vectors, tmp_path, old, new, reason):
    _need_node()
    web = tmp_path / "phone_web"
    shutil.copytree(WEB / "src", web / "src")
    shutil.copytree(WEB / "test", web / "test")
    shutil.copy(WEB / "package.json", web / "package.json")
    rules = web / "src" / "lanes" / "lane_rules.js"
    source = rules.read_text()
    assert source.count(old) == 1
    rules.write_text(source.replace(old, new))
    code, summary, diffs = _run(web, gate_vectors[0], "run_gate.mjs")
    assert code == 1 and diffs and summary["summary"]["pass"] < summary["summary"]["cases"]
    assert (gate_vectors[0] / GATE_FILE).is_file() and any(reason in json.dumps(d) for d in diffs), diffs[:3]
