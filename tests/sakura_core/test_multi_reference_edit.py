"""A two-reference template (try-on: person + garment) on the tiny klein folder through the whole path: ``sakura
precompute --image A --image B`` publishes one KV over both with the references listed in the manifest (each image's
digest, size, token grid and positions), ``open_template`` fetches both images, and ``run_template_edit`` edits with
fetched KV as the device does with both images (bit for bit when the model's KV is fp16: the fp16 rung is lossless)."""

from __future__ import annotations

import asyncio
import copy
import hashlib

import numpy as np
import pytest
from ci_deps import import_or_skip

from sakura_core import edit
from sakura_core.fetch.sources import StoreSource
from sakura_core.kv.manifest import ManifestError
from sakura_core.runtime.live_profile import LiveProfile

import_or_skip("transformers", "the klein text encoder needs transformers (pip install transformers)")

TID = "try-on-pair"
PROMPT = "dress the person in the garment"


@pytest.fixture(scope="module")
def published(tmp_path_factory, klein_folder):
    from cloud_server.store import LocalStore
    from sakura_core.cli import main

    root = tmp_path_factory.mktemp("pair-store")
    rc = main(
        [
            "precompute",
            "--store-profile",
            "full",
            "--store",
            str(root),
            "--model",
            str(klein_folder),
            "--image",
            "astronaut",
            "--image",
            "coffee",
            "--reference-name",
            "person",
            "--reference-name",
            "garment",
            "--id",
            TID,
        ]
    )
    assert rc == 0
    return root, LocalStore(root).get_manifest(TID)


def _read(root, digest: str) -> bytes:
    from cloud_server.store import LocalStore

    f, _ = LocalStore(root).open_shard(digest)
    with f:
        return f.read()


def _run(model, opened, policy: str, steps: int = 2):
    user = np.asarray(np.random.default_rng(2).integers(0, 256, (64, 64, 3)), np.uint8)
    settings = edit.EditSettings(PROMPT, steps=steps, seed=4, fetch=edit.FetchSettings(policy, "fixed:50"))
    profile = LiveProfile(0.01, 0.005, model.adapter.num_layers, steps)
    return asyncio.run(edit.run_template_edit(model, opened, user, settings, profile=profile))


def test_the_manifest_lists_both_references(published, klein_model):
    root, m = published
    assert m["token_grid"] == [8, 4] and m["rope_layout"] == "flux2-ref-t10-x2"
    refs = m["references"]
    assert [r["name"] for r in refs] == ["person", "garment"]
    assert [(r["size"], r["token_grid"], r["rope_t"], r["token_offset"], r["tokens"]) for r in refs] == [
        ([64, 64], [4, 4], 10, 0, 16),
        ([64, 64], [4, 4], 20, 16, 16),
    ]
    assert m["template_image"] == refs[0]["image"]
    for ref in refs:  # each image stored content-addressed, the PNG the KV was computed from
        png = _read(root, ref["image"]["digest"])
        assert hashlib.sha256(png).hexdigest() == ref["image"]["digest"] and len(png) == ref["image"]["bytes"]
    assert refs[0]["image"]["digest"] != refs[1]["image"]["digest"]
    opened = asyncio.run(edit.open_template(StoreSource(str(root)), TID, klein_model))
    assert opened.ref_grids == ((4, 4), (4, 4)) and len(opened.reference_files) == 2
    images = opened.template_image(64)
    kv = klein_model.adapter.extract_template_kv(klein_model.template_tokens(images), opened.ref_grids)
    assert list(kv.token_grid) == m["token_grid"] and kv.rope_layout == m["rope_layout"]


def test_fetched_kv_edits_as_the_device_does_with_both_images(published, klein_model):
    root, _ = published
    opened = asyncio.run(edit.open_template(StoreSource(str(root)), TID, klein_model))
    fetched = _run(klein_model, opened, "fetch-fp16")
    device = _run(klein_model, opened, "on-device-cached")
    assert fetched.run.result.bytes_fetched > 0 and device.run.result.bytes_fetched == 0 and not fetched.run.fallbacks
    err = float((fetched.run.tokens - device.run.tokens).abs().max())
    print(f"two references, fp32 model: fetched fp16 KV vs on-device max diff {err:.3e}")  # noqa: T201 (-s figure)
    assert 0 < err < 1e-4  # fp16 storage of fp32 KV only
    refs = fetched.report["template"]["references"]
    assert [(r["name"], r["tokens"]) for r in refs] == [("person", 16), ("garment", 16)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.pop("references"), "2 references .*has no 'references' field"),
        (lambda m: m["references"].pop(), "must list the 2 reference"),
        (lambda m: m["references"][1].update(token_offset=0), r"'references\[1\].token_offset' must be 16"),
        (lambda m: m["references"][1].update(rope_t=10), r"'references\[1\].rope_t' must be 20"),
        (lambda m: m["references"][0].update(image={"digest": "x"}), r"'references\[0\].image' must be \{digest"),
        (lambda m: m["references"][1].pop("image"), "names no template_image; republish it"),
        (lambda m: m["references"][0].update(image=m["references"][1]["image"]), "'template_image' must be refer"),
        (
            lambda m: m["references"][1].update(token_grid=[2, 8]),
            r"'references\[1\]': size .* must be \[S, S\] / \[4, 4\]",
        ),
        (lambda m: m.update(rope_layout="flux2-ref-t10-x3"), "do not stack 3 equal references"),
    ],
)
def test_a_manifest_whose_references_disagree_is_refused(published, klein_model, change, message):
    _, m = published
    bad = copy.deepcopy(m)
    change(bad)
    with pytest.raises(ManifestError, match=message):
        edit.check_template(bad, TID, klein_model)


def test_precompute_refuses_bad_reference_lists(tmp_path, klein_folder, capsys):
    from sakura_core.cli import main

    args = ["precompute", "--store", str(tmp_path), "--model", str(klein_folder), "--id", "x"]
    assert main([*args, *(["--image", "astronaut"] * 5)]) == 2
    assert "give 1..4 reference images, got 5" in capsys.readouterr().err
    assert main([*args, "--image", "astronaut", "--image", "coffee", "--reference-name", "person"]) == 2
    assert "--reference-name: give one per --image (2), got 1" in capsys.readouterr().err


@pytest.mark.slow
def test_fp16_model_fetched_and_hybrid_equal_the_device_exactly(tmp_path, klein_folder):
    """With the model in float16 its KV is float16, so the published fp16 rung is the exact KV: fetched everywhere
    and hybrid (layer 0 on the device, the rest fetched) equal the on-device template pass bit for bit."""
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore
    from sakura_core.kv.template_codec import decode_template
    from sakura_core.models.loading import load_edit_model
    from sakura_core.runtime.denoise import run_edit

    model = load_edit_model(str(klein_folder), dtype="float16")
    rng = np.random.default_rng(5)
    refs = [(rng.random((64, 64, 3)) * 255).astype(np.uint8) for _ in range(2)]
    store = LocalStore(tmp_path)
    manifest = publish_template(
        store, model, refs, TID, reference_names=["person", "garment"], store_profile="full"
    ).manifest
    blobs = {
        rep["digest"]: _read(tmp_path, rep["digest"]) for sh in manifest["shards"] for rep in sh["representations"]
    }
    fetched = decode_template(manifest, blobs, "fp16")
    user = (rng.random((64, 64, 3)) * 255).astype(np.uint8)
    L = model.adapter.num_layers
    device = run_edit(model, user, PROMPT, steps=2, kv_source=fetched, split_layer=L, template_image=refs).tokens
    diffs = {
        split: float(
            (
                run_edit(
                    model, user, PROMPT, steps=2, kv_source=fetched, split_layer=split, template_image=refs
                ).tokens
                - device
            )
            .abs()
            .max()
        )
        for split in (0, 1)
    }
    print(f"two references, fp16 model: fetched / hybrid vs on-device max diff {diffs}")  # noqa: T201 (-s figure)
    assert diffs == {0: 0.0, 1: 0.0}
    opened = asyncio.run(edit.open_template(StoreSource(str(tmp_path)), TID, model))
    wire = _run(model, opened, "fetch-fp16").run.tokens
    here = _run(model, opened, "on-device-cached").run.tokens
    assert float((wire - here).abs().max()) == 0.0  # the same through the shard client and the pipelined runtime
