"""Closed-loop twins of a cross-step per-step template (``cross_step.CLOSED_LOOP``): every residual level of a step
>= 1 has a twin ``<level>+cl`` coded against step s-1 as the level's track decodes it (step 0's level, then the
twins), named by that one representation's digest in the manifest and the blob header; it decodes only against it,
and carries no error from step to step."""

import copy

import pytest

from sakura_core.kv import decode_per_step, parse_shard
from sakura_core.kv.chain import DecodedReference, ShardChainError, decode_chain
from sakura_core.kv.manifest import ManifestError, parse_manifest
from sakura_core.precompute import ProbeConfig, precompute_template
from sakura_core.runtime.schedule import flow_timesteps

STEPS, SHIFT = 3, 1.0


@pytest.fixture(scope="module")
def template(demo_model, demo_template):
    return precompute_template(
        demo_model,
        demo_template,
        "astro-cl",
        probes=ProbeConfig(num_probes=2),
        held_out_probes=1,
        psnr_steps=0,
        kv_mode="per-step",
        steps=STEPS,
        shift=SHIFT,
    )


@pytest.fixture(scope="module")
def exact(demo_model, demo_template):
    ref = demo_model.template_tokens(demo_template)
    return demo_model.adapter.extract_per_step_kv(ref, demo_model.spec.grid, flow_timesteps(STEPS, SHIFT)[:-1])


def _shard(m, step, layer):
    return next(s for s in m["shards"] if s["step"] == step and s["layers"][0] == layer)


def _rep(m, step, layer, name):
    return next(r for r in _shard(m, step, layer)["representations"] if r["name"] == name)


def _levels(m):
    return [r["name"] for r in m["shards"][0]["representations"] if r["codec"] == "sakura"]


def test_each_later_step_has_a_twin_per_level_naming_its_tracks_reference(template):
    m = template.manifest
    for step in range(1, STEPS):
        for name in _levels(m):
            twin = _rep(m, step, 2, f"{name}+cl")
            track = _rep(m, step - 1, 2, name if step == 1 else f"{name}+cl")
            assert twin["ref"] == {"mode": "closed", "step": step - 1, "digest": track["digest"]}
            header = parse_shard(template.blobs[twin["digest"]])[0]
            assert header.reference == (step - 1, track["digest"]) and header.step == step
            assert twin["level"] > _rep(m, step, 2, "fp16")["level"]  # no rung of the ladder
    assert all("+cl" not in r["name"] for r in m["shards"][0]["representations"])  # step 0 roots the tracks
    parse_manifest(m)


def test_a_twin_track_carries_no_error_from_step_to_step(template, exact):
    m, blobs = template.manifest, template.blobs
    for name in _levels(m):
        open_loop = decode_per_step(m["shards"], blobs, name, STEPS)  # (steps, layers, 2, tokens, heads, head_dim)
        closed = decode_per_step(m["shards"], blobs, f"{name}+cl", STEPS)
        assert closed[0].equal(open_loop[0])  # step 0 is the level itself on both tracks
        last = exact.kv[STEPS - 1].float()
        err_open, err_closed = (float(((d[STEPS - 1] - last) ** 2).mean()) for d in (open_loop, closed))
        assert err_closed < err_open, name


def test_a_twin_decodes_only_against_the_representation_it_names(template):
    m, blobs = template.manifest, template.blobs
    twin = _rep(m, 1, 2, "sakura-l1+cl")
    open_ref = _rep(m, 0, 2, "sakura-l2")  # another level of the same shard: not its reference
    _, k, v = decode_chain([blobs[d] for d in [*open_ref["requires"], open_ref["digest"]]])
    with pytest.raises(ShardChainError, match="coded against step 0 shard"):
        decode_chain([blobs[twin["digest"]]], DecodedReference(0, open_ref["digest"], k, v))
    right = _rep(m, 0, 2, "sakura-l1")
    _, k, v = decode_chain([blobs[d] for d in [*right["requires"], right["digest"]]])
    decode_chain([blobs[twin["digest"]]], DecodedReference(0, right["digest"], k, v))


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        # a twin naming another level of its reference shard, or another layer's
        (
            lambda m: _rep(m, 1, 2, "sakura-l1+cl")["ref"].update(digest=_rep(m, 0, 2, "sakura-l2")["digest"]),
            "not sakura-l1 \\(the track of sakura-l1\\) of step 0 layers \\[2, 2\\] but sakura-l2",
        ),
        (
            lambda m: _rep(m, 1, 2, "sakura-l1+cl")["ref"].update(digest=_rep(m, 0, 3, "sakura-l1")["digest"]),
            "not sakura-l1 \\(the track",
        ),
        (
            lambda m: _rep(m, 2, 2, "sakura-l1+cl")["ref"].update(digest=_rep(m, 1, 2, "sakura-l1")["digest"]),
            "not sakura-l1\\+cl \\(the track of sakura-l1\\) of step 1 layers \\[2, 2\\] but sakura-l1$",
        ),  # step 1's open-loop level, not the track's twin: it is its own level's name
        (lambda m: _rep(m, 1, 2, "sakura-l1+cl").update(name="sakura-l1-closed"), "is named '<level>\\+cl'"),
    ],
)
def test_a_bad_twin_reference_is_refused_naming_the_field(template, mutate, problem):
    m = copy.deepcopy(template.manifest)
    mutate(m)
    with pytest.raises(ManifestError, match=problem):
        parse_manifest(m)
