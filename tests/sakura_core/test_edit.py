"""The one edit entry (sakura_core.edit): the template checks written once, the catalog message, the edit over a
local store served on loopback, and the report format (summary first, timeline last, no empty ``levels_used``)."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest

from sakura_core import edit, template_open
from sakura_core.edit_report import REPORT_KEYS, KVUse, edit_report, summary_line, with_psnr
from sakura_core.fetch.errors import ManifestError, ModelMismatchError, TemplateNotFoundError
from sakura_core.fetch.link import LinkSpec
from sakura_core.fetch.sources import StoreSource
from sakura_core.runtime.lane_types import LaneResult
from sakura_core.runtime.live_profile import LiveProfile
from sakura_core.runtime.pipeline import RunReport

TID = "edit-tpl"
PROMPT = "place it"


@pytest.fixture(scope="module")
def source(tmp_path_factory, demo_model, demo_template):
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore

    root = tmp_path_factory.mktemp("edit-store")
    publish_template(LocalStore(root), demo_model, demo_template, TID, store_profile="full")  # fetch-fp16 tests
    return StoreSource(str(root))


@pytest.fixture(scope="module")
def opened(source, demo_model):
    return asyncio.run(edit.open_template(source, TID, demo_model))


def _profile(model, steps):
    return LiveProfile(0.01, 0.005, model.adapter.num_layers, steps)


def test_check_template_is_the_one_check(opened, demo_model):
    assert edit.check_template(opened.manifest, TID, demo_model) is opened.manifest  # parsed already: not again
    manifest = opened.manifest.to_json()
    assert edit.check_template(copy.deepcopy(manifest), TID, demo_model).template_id == TID
    assert len(manifest["references"]) == 1 and manifest["references"][0]["image"] == manifest["template_image"]
    manifest = {k: v for k, v in manifest.items() if k != "references"}  # as published before references: any grid
    for grid in ([g // 2 for g in manifest["token_grid"]], [manifest["token_grid"][0] * 2, manifest["token_grid"][1]]):
        wrong_grid = {**copy.deepcopy(manifest), "token_grid": grid}  # smaller, or not square
        with pytest.raises(
            ManifestError, match=r"has token grid\(s\) \d+x\d+, the model edits .*resolution or larger"
        ):
            edit.check_template(wrong_grid, TID, demo_model)
    larger = {**copy.deepcopy(manifest), "token_grid": [g * 2 for g in manifest["token_grid"]]}
    assert edit.check_template(larger, TID, demo_model).token_grid == tuple(larger["token_grid"])  # its own ids
    no_image = {k: v for k, v in copy.deepcopy(manifest).items() if k != "template_image"}
    with pytest.raises(ManifestError, match="names no template_image; republish it"):
        edit.check_template(no_image, TID, demo_model)
    with pytest.raises(ModelMismatchError, match="precompute it for this model"):
        edit.check_template(copy.deepcopy(manifest), TID, edit.ModelKey("f" * 64, tuple(demo_model.spec.grid)))


def test_open_template_fetches_the_checked_manifest_and_the_image(opened, demo_model, demo_template):
    assert opened.template_id == TID and opened.model_id == demo_model.model_id
    assert opened.token_grid == tuple(demo_model.spec.grid)
    size = demo_model.spec.image_size
    np.testing.assert_array_equal(opened.template_image(size), demo_template)  # published as PNG: lossless
    summary = opened.summary()
    assert summary["source"].startswith("store:") and summary["image_bytes"] == len(opened.image_file) > 0
    assert summary["num_layers"] == demo_model.adapter.num_layers and "fp16" in summary["bytes_per_level"]


def test_unknown_template_lists_the_catalog(source, demo_model):
    with pytest.raises(
        TemplateNotFoundError, match=rf"'nope' is not in the catalog of store:.*; published there: {TID}"
    ):
        asyncio.run(template_open.fetch_template_manifest(source, "nope", demo_model))


def test_a_folder_that_is_no_store_says_how_to_make_one(tmp_path, demo_model):
    with pytest.raises(ValueError, match="is not a SAKURA store .*`sakura precompute --store"):
        asyncio.run(edit.open_template(StoreSource(str(tmp_path)), TID, demo_model))


def test_run_template_edit_report_format(opened, demo_model, demo_template):
    user = np.full_like(demo_template, 128)
    settings = edit.EditSettings(PROMPT, steps=2, seed=3, fetch=edit.FetchSettings("on-device-cached"))
    out = asyncio.run(edit.run_template_edit(demo_model, opened, user, settings, profile=_profile(demo_model, 2)))
    r = out.report
    assert tuple(r) == REPORT_KEYS and next(iter(r)) == "summary" and list(r)[-1] == "timeline"
    L = demo_model.adapter.num_layers
    assert (
        r["summary"]
        == f"on-device-cached: {r['latency_s']:.2f} s, nothing fetched, every layer computed here, live link"
    )
    assert r["levels_used"] == "none fetched" and r["bytes_fetched"] == r["bytes_used"] == 0 and r["split_layer"] == L
    assert r["peak_kv_bytes"] == 0
    assert r["link"] == "live" and r["executed_on"] == {"kind": "local"} and r["template_id"] == TID
    assert r["timeline"][0]["level"] == "template image" and r["timeline"][0]["end"] <= 0
    assert out.image.shape == demo_template.shape and out.run.image is out.image


def test_run_template_edit_over_a_fixed_link_fetches(opened, demo_model, demo_template):
    settings = edit.EditSettings(PROMPT, steps=1, seed=0, fetch=edit.FetchSettings("fetch-fp16", "fixed:200"))
    out = asyncio.run(
        edit.run_template_edit(demo_model, opened, demo_template, settings, profile=_profile(demo_model, 1))
    )
    r = out.report
    assert r["link"] == "fixed:200" and r["bytes_fetched"] > 0 and r["split_layer"] == 0
    assert set(r["levels_used"]) == {str(i) for i in range(demo_model.adapter.num_layers)}
    a = demo_model.adapter  # single mode: every layer's fp16 K and V held for the whole edit
    assert r["peak_kv_bytes"] == a.num_layers * 2 * demo_model.spec.num_tokens * a.num_heads * a.head_dim * 2
    assert r["bytes_used"] == r["bytes_fetched"]  # fetch-fp16 fetches each shard once, and uses it
    kib = r["bytes_fetched"] / 1024
    assert f", fetched {kib:.1f} KiB, used {kib:.1f} KiB (every layer), split at layer 0 of " in r["summary"]
    assert r["summary"].endswith("fixed 200 Mbit/s")


def test_a_profile_measured_for_other_steps_predicts_the_edits_steps(opened, demo_model, demo_template):
    """The phone agent measures its profile once (8 steps) and runs jobs of any step count: the policy predicts the
    job's steps, and the report's profile says so."""
    settings = edit.EditSettings(PROMPT, steps=2, seed=0, fetch=edit.FetchSettings("on-device-cached"))
    out = asyncio.run(
        edit.run_template_edit(demo_model, opened, demo_template, settings, profile=_profile(demo_model, 8))
    )
    assert out.report["steps"] == out.report["profile"]["steps"] == 2


def test_run_template_edit_refuses_another_model(opened, demo_model, demo_template):
    other = copy.copy(opened)
    object.__setattr__(other, "model_id", "e" * 64)
    with pytest.raises(ValueError, match="open the template with the model that edits"):
        asyncio.run(edit.run_template_edit(demo_model, other, demo_template, edit.EditSettings(PROMPT)))


def test_settings_and_requests_name_the_bad_value():
    with pytest.raises(ValueError, match="policy 'free-kv' cannot run an edit; choose one of"):
        edit.FetchSettings("free-kv")
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        edit.EditSettings(PROMPT, steps=0)
    with pytest.raises(ValueError, match="seed must be in 0..2\\*\\*63-1, got -1"):
        edit.EditSettings(PROMPT, seed=-1)
    with pytest.raises(ValueError, match="steps must be an integer, got True"):
        edit.EditSettings(PROMPT, steps=True)
    with pytest.raises(ValueError, match="latency_target_s must be > 0 seconds or None, got 0"):
        edit.FetchSettings(latency_target_s=0)
    with pytest.raises(ValueError, match="'fixed:x'"):
        edit.FetchSettings(link="fixed:x")  # the string form is parsed, here
    settings = edit.EditSettings(PROMPT, fetch=edit.FetchSettings(link="fixed:5"))
    request = edit.EditRequest(edit.ServerSource("http://127.0.0.1:9/", "secret-token"), TID, settings)
    assert request.settings.link == LinkSpec.fixed(5) and request.source.url == "http://127.0.0.1:9"
    assert "secret-token" not in repr(request) and "secret-token" not in repr(request.source)


def test_edit_report_by_hand():
    result = LaneResult(
        policy="sakura",
        latency_s=1.234,
        bytes_fetched=3 * 1024,
        split_layer=2,
        events=[{"lane": "compute", "start": 0.0, "end": 1.0, "layer": 0, "level": "template"}],
    )
    run = RunReport(
        result,
        image=np.zeros((2, 2, 3), np.uint8),
        tokens=None,
        levels_used={3: ["int4"], 2: ["int2", "int4"]},
        bytes_used=2 * 1024,
    )
    report = edit_report(
        run,
        template_id="t",
        template={},
        link=LinkSpec.fixed(8),
        steps=1,
        seed=0,
        latency_target_s=None,
        floor_level="int4",
        profile=LiveProfile(0.1, 0.05, 4, 1),
        executed_on={"kind": "local"},
        extra_events=[{"lane": "fetch", "start": -0.5, "end": -0.1}],
    )
    assert tuple(report) == REPORT_KEYS
    assert report["summary"] == (
        "sakura: 1.23 s, fetched 3.0 KiB, used 2.0 KiB (layers 2-3), split at layer 2 of 4, fixed 8 Mbit/s"
    )
    assert report["bytes_used"] == 2 * 1024
    assert report["levels_used"] == {"2": ["int2", "int4"], "3": ["int4"]}
    assert [e["lane"] for e in report["timeline"]] == ["fetch", "compute"]
    assert with_psnr(report, 38.04)["summary"].endswith("fixed 8 Mbit/s, PSNR 38.0 dB")
    assert summary_line("on-device", 2.0, KVUse(0, 0, 4, 4), "live link") == (
        "on-device: 2.00 s, nothing fetched, every layer computed here, live link"
    )
