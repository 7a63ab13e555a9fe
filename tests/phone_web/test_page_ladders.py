"""The page's fetch plan (``phone_web/src/lanes/ladders.js`` pageLadders, through ``phone_web/test/run_ladders.mjs``)
equals Python's (:func:`sakura_core.policy.plan.plan_fetch`) on a real per-step template of the demo model (sakura
codec, full store, as ``sakura bench e2e --mode page`` publishes it): per shard every level with its cross-step links
(reference step, closed-loop twin, open-loop floor off the twins' track), the representations fetched for it, and the
floor — for sakura and fetch-fp16; and the page's lanes on that template (``phone_web/test/run_lanes_real.mjs``: its real
decoders, a fake link and DiT step) fetch cross-step levels at steps >= 1 and compute every step with the KV the
fixed-level decoder (``src/template.js``, bit-exact with Python's) gives at the levels they report."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from ci_deps import require_or_skip

from .policy_record import level_json

WEB = Path(__file__).resolve().parents[2] / "phone_web"
NODE = shutil.which("node")


@pytest.fixture(scope="module")
def per_step_manifest(tmp_path_factory) -> Path:
    """The manifest of the per-step sakura template (3 steps), written as JSON beside its store (``store/``)."""
    import torch

    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.models.edit_model import load_demo_model, load_image

    require_or_skip(NODE is not None, "node is not installed (apt-get install nodejs npm)")
    root = tmp_path_factory.mktemp("ladders")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = load_demo_model()
        store = LocalStore(root / "store")
        image = load_image("astronaut", model.spec.image_size)
        publish_template(
            store, model, image, "ladders", kv_mode="per-step", steps=3, codec="sakura", store_profile="full"
        )
    finally:
        torch.set_num_threads(threads)
    path = root / "manifest.json"
    path.write_text(json.dumps(store.get_manifest("ladders")))
    return path


def _same_floats(lv: dict | None) -> dict | None:
    """A level's fields with its MSE to 12 significant digits (``10 ** x`` of node's libm and CPython's may differ in
    the last bit); the rest exactly."""
    if lv is None:
        return None
    return {**lv, "mse": float(f"{lv['mse']:.12e}"), "closed": _same_floats(lv["closed"])}


@pytest.mark.parametrize("policy", ["sakura", "fetch-fp16"])
def test_the_page_ladders_equal_python_plan_fetch(per_step_manifest, policy):
    from sakura_core.policy.plan import plan_fetch

    manifest = json.loads(per_step_manifest.read_text())
    plan = plan_fetch(manifest, policy)
    family = plan.policy.family
    proc = subprocess.run(
        [NODE, "test/run_ladders.mjs", str(per_step_manifest), family],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=WEB,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = json.loads(proc.stdout)
    want = [[level_json(r.level) for r in ladder] for ladder in plan.rungs]
    reps = [
        [{"digest": r.rep.digest, "twin": r.rep.closed_twin.digest if r.rep.closed_twin else None} for r in ladder]
        for ladder in plan.rungs
    ]
    for g, (got, exp) in enumerate(zip(page["ladders"], want, strict=True)):
        assert [_same_floats(x) for x in got] == [_same_floats(x) for x in exp], g
    assert page["reps"] == reps
    assert page["floor"] == [plan.floor] * len(plan.rungs)
    if family == "sakura":  # the cross-step levels are there: residuals on step 0, twins, the open-loop floor
        later = plan.rungs[len(plan.rungs) // 3 * 2]
        assert any(r.level.ref_step is not None for r in later) and any(r.level.closed for r in later)
        assert any(r.level.off_track is not None for r in later)


def test_the_page_lanes_decode_cross_step_levels_with_their_reference(per_step_manifest):
    require_or_skip((WEB / "node_modules" / "fzstd").is_dir(), "phone_web's npm packages are not installed (npm ci)")
    store = per_step_manifest.parent / "store"
    proc = subprocess.run(
        [NODE, "test/run_lanes_real.mjs", str(store), "ladders"], capture_output=True, text=True, timeout=300, cwd=WEB
    )
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    print(lines[-1]["figures"])  # noqa: T201 - the levels used and the bytes fetched (pytest -s)
    assert proc.returncode == 0 and lines[-1]["ok"], lines[-1]
