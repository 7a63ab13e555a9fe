"""Issue 15 points 2 and 5: a tampered manifest falls back (never a silently wrong edit), and a cancel is honoured
while the compute thread waits for a shard."""

import asyncio
import copy
import threading

import numpy as np
import pytest

from sakura_core.fetch.traces import Trace
from sakura_core.models.edit_model import load_demo_model, load_image
from sakura_core.policy.ladder import rungs_from_manifest
from sakura_core.policy.plan import FetchPlan
from sakura_core.policy.policies import make_policy
from sakura_core.precompute import precompute_template
from sakura_core.runtime.lane_parts import EditInputs, RunControls
from sakura_core.runtime.live_profile import LiveProfile
from sakura_core.runtime.pipeline import Cancelled, LiveSettings, RuntimeConfig, run_pipelined_edit

STEPS = 2


@pytest.fixture(scope="module")
def setup():
    model = load_demo_model(weights=None)
    size = model.spec.image_size
    tpl, other, usr = (load_image(name, size) for name in ("astronaut", "coffee", "chelsea"))
    pre = precompute_template(model, tpl, "tpl", codec="fp16", held_out_probes=1, psnr_steps=0)
    pre_other = precompute_template(model, other, "tpl-other", codec="fp16", held_out_probes=1, psnr_steps=0)
    L = model.adapter.num_layers
    profile = LiveProfile(layer_full_s=0.2, layer_cached_s=0.1, layers=L, steps=STEPS)
    return model, tpl, usr, pre, pre_other, profile


def _fp16(manifest, layer) -> dict:
    return next(r for r in manifest["shards"][layer]["representations"] if r["name"] == "fp16")


def _run(setup, manifest, blobs, policy="fetch-fp16", config=None, cancel=None):
    model, tpl, usr, _pre, _other, profile = setup
    rungs = rungs_from_manifest(manifest, 6e8)

    async def fetch_blob(digest, nbytes):
        return blobs[digest]

    return asyncio.run(
        run_pipelined_edit(
            EditInputs(model, usr, "p", tpl),
            manifest,
            fetch_blob,
            FetchPlan(make_policy(policy), rungs, 0),
            profile,
            trace=Trace.constant(50.0),
            config=config or RuntimeConfig(live=LiveSettings(steps=STEPS)),
            controls=RunControls(cancel=cancel),
        )
    )


def test_swapped_layer_digests_fall_back_and_say_so(setup):
    _, _, _, pre, _, _ = setup
    manifest = copy.deepcopy(pre.manifest)
    a, b = _fp16(manifest, 0), _fp16(manifest, 1)
    a["digest"], b["digest"] = b["digest"], a["digest"]  # both blobs are intact: only their slots are wrong
    rep = _run(setup, manifest, pre.blobs)
    honest = _run(setup, pre.manifest, pre.blobs)
    for layer in (0, 1):
        assert any(f.startswith(f"shard {layer}:") and "layers" in f and "does not belong" in f for f in rep.fallbacks)
        assert rep.levels_used[layer] == ["device"] * STEPS
    assert (rep.tokens - honest.tokens).abs().max() < 2e-3  # fp16 storage of the other layers only


def test_shards_of_another_template_fall_back_to_the_on_device_edit(setup):
    _, _, _, pre, other, _ = setup
    manifest = copy.deepcopy(pre.manifest)
    for layer in range(len(manifest["shards"])):  # every layer points at the other template's shard
        _fp16(manifest, layer)["digest"] = _fp16(other.manifest, layer)["digest"]
    blobs = {**pre.blobs, **other.blobs}
    rep = _run(setup, manifest, blobs)
    on_device = _run(setup, pre.manifest, pre.blobs, policy="on-device-cached")
    assert len(rep.fallbacks) == len(manifest["shards"])
    assert all("template 'tpl-other' (expected 'tpl')" in f for f in rep.fallbacks)
    assert (rep.tokens - on_device.tokens).abs().max() <= 1e-5  # the on-device edit, not the other template's


def test_cancel_is_honoured_while_waiting_for_a_shard(setup, manual_clock):
    """The job is cancelled (its timeout) while the compute lane waits for a shard that never comes: the wait
    ends with the cancel, not after ``shard_wait_s``. The cancel comes the second time the policy is asked about
    the late shard (at the wait's start, then one poll into it: the compute lane is waiting then), on the test's
    clock."""
    _, _, _, pre, _, _ = setup
    cancel = threading.Event()
    outcome = {}

    class CancelWhileWaiting(type(make_policy("fetch-fp16"))):
        def recompute_late(self, ctx, layer):
            outcome.setdefault("asked_s", []).append(ctx.stalled_s)
            if len(outcome["asked_s"]) == 2:
                cancel.set()
            return False

    def run() -> None:
        async def never(digest, nbytes):  # a dead link: the shard never arrives
            await asyncio.Event().wait()

        model, tpl, usr, _pre, _other, profile = setup
        rungs = rungs_from_manifest(pre.manifest, 6e8)
        try:
            asyncio.run(
                run_pipelined_edit(
                    EditInputs(model, usr, "p", tpl),
                    pre.manifest,
                    never,
                    FetchPlan(CancelWhileWaiting(), rungs, 0),
                    profile,
                    config=RuntimeConfig(live=LiveSettings(steps=STEPS, shard_wait_s=600)),
                    controls=RunControls(cancel=cancel, clock=manual_clock),
                )
            )
        except Cancelled as e:
            outcome["cancelled"] = str(e)
            outcome["at_s"] = manual_clock.now()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)  # the shard wait is 600 s of the clock (2 min of real time): only the cancel ends it sooner
    assert not worker.is_alive(), "the compute thread kept waiting for its shard after the cancel"
    assert outcome["cancelled"] == "edit cancelled at step 0, layer 0 while waiting for its shard"
    assert outcome["asked_s"] == pytest.approx([0.0, 0.1]) and outcome["at_s"] < 1.0  # one poll, then the cancel


async def test_a_tampered_manifest_json_on_the_server_is_reported_by_the_edit(setup, tmp_path, aiohttp_server):
    """End to end: ``manifest.json`` edited on the server's disk (two layers' digests swapped, one layer pointing at
    another template's shard); the served edit falls back, says so in its report, and equals the on-device edit."""
    import json

    from cloud_server.app import create_app
    from cloud_server.config import ServerConfig
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.edit import EditRequest, EditSettings, FetchSettings, ServerSource, edit_from_server

    model, tpl, usr, pre, other, profile = setup
    store = LocalStore(tmp_path / "store")
    for template_id, image, result in (("tpl", tpl, pre), ("tpl-other", usr, other)):
        publish_template(store, model, image, template_id, precompute_fn=lambda *a, _r=result, **k: _r)
    path = store.root / "templates" / "tpl" / "manifest.json"
    manifest = json.loads(path.read_text())
    a, b, c = _fp16(manifest, 0), _fp16(manifest, 1), _fp16(manifest, 2)
    a["digest"], b["digest"] = b["digest"], a["digest"]
    c.update({k: _fp16(other.manifest, 2)[k] for k in ("digest", "bytes", "total_bytes")})  # sizes too: consistent
    path.write_text(json.dumps(manifest))
    server = await aiohttp_server(create_app(ServerConfig(store_dir=store.root, model=None), store=store))
    url = str(server.make_url("")).rstrip("/")

    async def edit(policy):
        request = EditRequest(ServerSource(url), "tpl", EditSettings("p", STEPS, fetch=FetchSettings(policy)))
        return await edit_from_server(model, request, usr, profile=profile)

    tampered, on_device = await edit("fetch-fp16"), await edit("on-device-cached")
    fallbacks = tampered.report["fallbacks"]
    assert [f.split(":")[0] for f in fallbacks] == ["shard 0", "shard 1", "shard 2"], fallbacks
    assert "template 'tpl-other' (expected 'tpl')" in fallbacks[2] and "layers 1-1 (expected 0-0)" in fallbacks[0]
    for layer in (0, 1, 2):
        assert tampered.report["levels_used"][str(layer)] == ["device"] * STEPS
    diff = np.abs(tampered.image.astype(int) - on_device.image.astype(int)).max()
    assert diff <= 1  # the other layers came as fp16 KV: at most one grey level from the on-device edit
