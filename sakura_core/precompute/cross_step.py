"""Per-step templates coded across steps: step 0 as a self-contained ladder, every later step s as a ladder of
residuals ``KV_s - a * KV_{s-1}`` against the step before it (``a``: a per-channel predictor scale, :mod:`..kv.
predictor`, in the residual's base blob header), plus its exact fp16 and a zero-byte ``reuse`` rung.

What a client fetches for step s at level j: the residual of (s, layer) at level j (one direct blob per level, see
``PROGRESSIVE_RESIDUALS``; ``requires`` + its digest); what it needs decoded first: the shard (s-1, layer) at any
level, or its exact KV computed on the device (the manifest ``ref`` names it by its fp16 digest). Decoded KV =
``a`` * the reference as decoded + the decoded residual.
Open loop: the residual is coded against the *exact* KV_{s-1}, so any representation of the reference serves (an
upgrade of it improves what adds it) and the errors of a chain add up, no more (not residuals against step 0: they
grow with the distance between the steps, where step-to-step residuals stay small). The ``reuse`` rung (0 bytes)
takes step s-1's decoded KV of the layer as it is. The fp16 representation of every shard stays self-contained (a
client whose base is missing or corrupt can still fetch the exact KV). Residuals are allocated with the base's
rate-distortion thresholds (level j spends a bit on a residual unit only where it buys as much output error as a bit
of the base), their dropped units reconstructed as the mean residual (i.e. the base's value), so a layer that
barely moves between steps costs almost nothing.

Closed-loop twins (``CLOSED_LOOP``): beside each open-loop residual level j, a representation named
``closed_name(j)`` (``sakura-l2+cl``) codes ``KV_s - a * D_j(s-1)``, where ``D_j(s-1)`` is step s-1 exactly as a
client decodes it on the level-j track: step 0's level j, then the twins of level j. Its manifest ``ref`` (mode
``closed``) and its header name the digest of that one representation, so it decodes only against it (the chain
decoder compares the digests) — no error is carried from step to step, so the quality floor (>= 35 dB) is reached at
a cheaper level on the twins' track than open loop (``sakura precompute --kv-mode per-step --compare-single`` prints
both families). A client fetches a twin instead of level j when it holds the reference's level-j track
representation (a layer kept at one level); after a level change, or for a layer computed on the device, the
open-loop level (or, below the open-loop floor, that floor) serves: ``policy.ladder.fetch_as``. Twins carry level
numbers above fp16 (no rung of the ladder: a client substitutes them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..kv.chain import DecodedReference, decode_chain
from ..kv.codec_registry import Codec, get_codec
from ..kv.container import shard_digest
from ..kv.manifest_schema import CLOSED_REF_MODE
from ..kv.names import base_level_name, closed_name
from ..kv.predictor import fit_scale_codes, scales_from_codes
from ..kv.template_codec import shard_inputs
from ..models.kv_types import TemplateKV
from .importance import attention_error

__all__ = [
    "REUSE",
    "StepBase",
    "bytes_at_psnr",
    "compare_to_single",
    "encode_residual_step",
    "floor_level",
    "level_totals",
    "storage",
    "reuse_representation",
]

REUSE = "reuse"
#: Predict step s as a per-channel scale of step s - 1 (:mod:`..kv.predictor`), not as step s - 1 itself.
AFFINE_PREDICTOR = True
#: Code a residual level as a chain of refinements of the lower ones (progressive) — or, off, as one direct blob per
#: level. A per-step shard serves one step, so its level is picked before that step and an upgrade in between is
#: rare; a chain pays each blob's container and width table again (a fixed cost per blob, most of a cheap residual
#: level's bytes), a direct blob once. Step 0 and single-mode ladders stay progressive.
PROGRESSIVE_RESIDUALS = False
#: Weigh a residual unit of step s by the steps its error reaches, ``(steps - s) / steps`` of a step-0 unit (open
#: loop: step s's residual error stays in every later step's decoded KV, step 0's in all of them).
PROPAGATION_WEIGHTS = True
#: Code a closed-loop twin of every residual level (see the module docstring). Its units are weighed as a step-0
#: unit's: a twin's error stays in its own step (the next twin codes it away).
CLOSED_LOOP = True


@dataclass
class StepBase:
    """What the next step is coded against: this step's exact KV, per first layer its shard's fp16 digest and its
    decoded KV at every level name, and the ladder's rate-distortion thresholds (step 0's, shared by every step;
    ``None`` without importance weights)."""

    kv: TemplateKV
    slopes: tuple[float, ...] | None = None
    exact_digest: dict[int, str] = field(default_factory=dict)
    decoded: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    #: the closed-loop track: per (first layer, level name) the representation a twin of the next step is coded
    #: against (step 0: the level itself; later: its twin) — its digest and its decoded K, V
    track_digest: dict[tuple[int, str], str] = field(default_factory=dict)
    track_decoded: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def start_track(self, step_shards: list[dict]) -> None:
        """Step 0 (self-contained levels) roots the closed-loop tracks: each level is its own track's reference."""
        self.track_digest = {
            (sh["layers"][0], r["name"]): r["digest"] for sh in step_shards for r in sh["representations"]
        }
        self.track_decoded = dict(self.decoded)


def _attn_error(held, kv: TemplateKV, first: int, k: np.ndarray, v: np.ndarray) -> float:
    import torch

    approx = {first + i: (torch.from_numpy(k[i]), torch.from_numpy(v[i])) for i in range(k.shape[0])}
    return round(attention_error(held, kv, approx), 8)


def reuse_representation(step: int, layers: list[int], prev_exact: dict[int, str], held, kv, prev_kv) -> dict:
    """The zero-byte rung of shard (step, layers): step - 1's decoded KV as it is (distortion: the exact previous
    step's KV against this step's; its end-to-end PSNR is measured with the others)."""
    first, last = layers
    x = prev_kv.kv[first : last + 1].float().numpy()  # (layers, 2, tokens, heads, head_dim)
    return {
        "level": 0,
        "name": REUSE,
        "codec": REUSE,
        "bytes": 0,
        "total_bytes": 0,
        "distortion": _attn_error(held, kv, first, x[:, 0], x[:, 1]),
        "digest": None,
        "requires": [],
        "ref": {"mode": REUSE, "step": step - 1, "digest": prev_exact[first]},
    }


def encode_residual_step(
    ladder: Codec,
    kv: TemplateKV,
    base: StepBase,
    step: int,
    importance,
    held,
    template_id: str,
    shard_layers: int,
    blobs: dict[str, bytes],
    steps: int | None = None,
) -> tuple[list[dict], StepBase]:
    """Shard entries of step ``step`` (residual ladder against ``base`` = step - 1, fp16) and what step + 1 is
    coded against."""
    scales = _predictor_scales(kv, base.kv, shard_layers) if AFFINE_PREDICTOR else {}
    prediction = base.kv.kv.float().clone()  # (layers, 2, tokens, heads, head_dim): a * KV_{s-1}
    for first, codes in scales.items():
        a = scales_from_codes(codes, *_shard_geometry(kv, first, shard_layers))  # (2, layers, 1, heads, head_dim)
        n_l = a.shape[1]
        prediction[first : first + n_l] *= torch.from_numpy(a).transpose(0, 1)
    residual = TemplateKV(kv.kv.float() - prediction, kv.model_id, kv.token_grid, kv.rope_layout)
    ref_step = step - 1
    refs = {first: (ref_step, d) for first, d in base.exact_digest.items()}
    inputs = shard_inputs(residual, template_id, importance, shard_layers, step=step, references=refs)
    # a dropped residual unit keeps the base's value: its cost is the weighted residual itself, not k_drop
    f = (steps - step) / steps if (steps and PROPAGATION_WEIGHTS) else 1.0
    inputs = [
        replace(
            x,
            k_drop=None,
            level_slopes=base.slopes,
            meta=replace(x.meta, ref_scale=scales.get(x.meta.layer_first)),
            **_scaled_weights(x, f),
        )
        for x in inputs
    ]
    exact_inputs = shard_inputs(kv, template_id, None, shard_layers, step=step)
    entries, nxt = [], StepBase(kv, base.slopes)
    twins = None
    if CLOSED_LOOP and base.track_digest:
        twins = _twin_blobs(ladder, kv, base, step, scales, importance, template_id, shard_layers)
    for i, (shard, exact_shard) in enumerate(zip(inputs, exact_inputs, strict=True)):
        first = shard.meta.layer_first
        last = first + shard.k.shape[0] - 1
        reps = []
        chain: list[bytes] = []
        for level, blob in zip(ladder.levels, _residual_blobs(ladder, shard), strict=True):
            chain = chain + [blob] if (ladder.progressive and PROGRESSIVE_RESIDUALS) else [blob]
            name = ladder.level_name(level)
            ref = DecodedReference(ref_step, base.exact_digest[first], *base.decoded[(first, name)])
            _, k, v = decode_chain(chain, ref)
            nxt.decoded[(first, name)] = (k, v)
            reps.append(_rep(ladder, level + 1, name, chain, _attn_error(held, kv, first, k, v)))
            reps[-1]["ref"] = {"mode": "residual", "step": ref_step, "digest": base.exact_digest[first]}
            blobs[reps[-1]["digest"]] = blob
        fp16 = get_codec("fp16")
        (fp16_blob,) = fp16.encode(exact_shard, [0])
        _, k, v = decode_chain([fp16_blob])
        nxt.decoded[(first, "fp16")] = (k, v)
        reps.append(_rep(fp16, len(ladder.levels) + 1, "fp16", [fp16_blob], _attn_error(held, kv, first, k, v)))
        blobs[reps[-1]["digest"]] = fp16_blob
        nxt.exact_digest[first] = reps[-1]["digest"]
        if twins is not None:
            reps += _twin_reps(ladder, twins, i, first, base, nxt, step, held, kv, blobs)
        entries.append({"layers": [first, last], "representations": reps})
    return entries, nxt


def _twin_reps(ladder, twins, i: int, first: int, base: StepBase, nxt: StepBase, step, held, kv, blobs) -> list[dict]:
    """Shard ``i``'s closed-loop twins (levels above fp16), decoded against their track references; ``nxt``'s
    track moves on to them."""
    reps = []
    top = len(ladder.levels) + 1  # fp16's level
    for n, (level, per_shard) in enumerate(zip(ladder.levels, twins, strict=True)):
        name = ladder.level_name(level)
        blob = per_shard[i]
        ref = DecodedReference(step - 1, base.track_digest[(first, name)], *base.track_decoded[(first, name)])
        _, k, v = decode_chain([blob], ref)
        reps.append(_rep(ladder, top + 1 + n, closed_name(name), [blob], _attn_error(held, kv, first, k, v)))
        reps[-1]["ref"] = {"mode": CLOSED_REF_MODE, "step": step - 1, "digest": ref.digest}
        nxt.track_digest[(first, name)] = reps[-1]["digest"]
        nxt.track_decoded[(first, name)] = (k, v)
        blobs[reps[-1]["digest"]] = blob
    return reps


def _twin_blobs(
    ladder, kv: TemplateKV, base: StepBase, step: int, scales: dict, importance, template_id: str, shard_layers: int
) -> list[list[bytes]]:
    """Per level (ladder order), per shard: the direct blob of ``KV_s - a * D_j(s-1)``, ``D_j(s-1)`` the level-j
    track's decoded step s-1 (closed loop; its units weighed as step 0's)."""
    out = []
    firsts = range(0, kv.num_layers, shard_layers)
    for level in ladder.levels:
        name = ladder.level_name(level)
        prediction = torch.empty_like(kv.kv, dtype=torch.float32)  # (layers, 2, tokens, heads, head_dim)
        for first in firsts:
            k, v = base.track_decoded[(first, name)]  # (shard layers, tokens, heads, head_dim) float16
            sl = slice(first, first + k.shape[0])
            prediction[sl, 0], prediction[sl, 1] = torch.from_numpy(k).float(), torch.from_numpy(v).float()
            if first in scales:
                a = scales_from_codes(scales[first], *_shard_geometry(kv, first, shard_layers))  # (2, l, 1, h, d)
                prediction[sl] *= torch.from_numpy(a).transpose(0, 1)
        residual = TemplateKV(kv.kv.float() - prediction, kv.model_id, kv.token_grid, kv.rope_layout)
        refs = {first: (step - 1, base.track_digest[(first, name)]) for first in firsts}
        inputs = shard_inputs(residual, template_id, importance, shard_layers, step=step, references=refs)
        inputs = [
            replace(
                x,
                k_drop=None,
                level_slopes=base.slopes,
                meta=replace(x.meta, ref_scale=scales.get(x.meta.layer_first)),
            )
            for x in inputs
        ]
        out.append([ladder.direct_blobs(x, [level])[0] for x in inputs])
    return out


def _residual_blobs(ladder: Codec, shard) -> list[bytes]:
    """A residual shard's blob per level: the progressive chain, or (``PROGRESSIVE_RESIDUALS`` off) each level's
    direct blob (the same decoded KV, bit for bit, in one blob)."""
    if ladder.progressive and not PROGRESSIVE_RESIDUALS:
        return ladder.direct_blobs(shard, ladder.levels)
    return ladder.encode(shard, ladder.levels)


def _shard_geometry(kv: TemplateKV, first: int, shard_layers: int) -> tuple[int, int, int]:
    return min(shard_layers, kv.num_layers - first), kv.num_heads, kv.head_dim


def _predictor_scales(kv: TemplateKV, prev: TemplateKV, shard_layers: int) -> dict[int, bytes]:
    """Per shard (first layer), the scale codes of step s's exact KV on step s - 1's (:mod:`..kv.predictor`)."""
    out = {}
    for first in range(0, kv.num_layers, shard_layers):
        s = slice(first, first + shard_layers)
        # (layers, 2, tokens, heads, head_dim) -> (2, layers, tokens, heads, head_dim)
        ref, cur = (x.kv[s].float().transpose(0, 1).numpy() for x in (prev, kv))
        out[first] = fit_scale_codes(ref, cur)
    return out


def _scaled_weights(shard, f: float) -> dict:
    if shard.k_weight is None or f == 1.0:
        return {}
    return {"k_weight": shard.k_weight * np.float32(f), "v_weight": shard.v_weight * np.float32(f)}


def _rep(codec: Codec, level: int, name: str, chain: list[bytes], distortion: float) -> dict:
    return {
        "level": int(level),
        "name": name,
        "codec": codec.name,
        "bytes": len(chain[-1]),
        "total_bytes": sum(len(b) for b in chain),
        "distortion": distortion,
        "digest": shard_digest(chain[-1]),
        "requires": [shard_digest(b) for b in chain[:-1]],
    }


def level_totals(manifest: dict) -> list[dict]:
    """Per level name held for every shard (cheapest first): bytes to fetch the whole template at that level from
    nothing (every shard's chain; a residual's reference is counted once, with its own shard; a closed-loop twin's or the reuse rung's
    track starts at step 0's level or fp16) and its measured ``psnr_db``."""
    per_name: dict[str, dict] = {}
    for shard in manifest["shards"]:
        for rep in shard["representations"]:
            row = per_name.setdefault(rep["name"], {"name": rep["name"], "bytes": 0, "psnr_db": rep.get("psnr_db")})
            row["bytes"] += rep.get("total_bytes", rep["bytes"])
    step0 = [r for sh in manifest["shards"] if sh.get("step") == 0 for r in sh["representations"]]
    held = [({r["name"] for r in sh["representations"]}, sh.get("step") == 0) for sh in manifest["shards"]]
    complete = []
    for name, row in per_name.items():  # a track's step 0 is another level (what its PSNR was measured with)
        at0 = "fp16" if name == REUSE else base_level_name(name)
        if at0 != name:
            row["bytes"] += sum(r.get("total_bytes", r["bytes"]) for r in step0 if r["name"] == at0)
        if all(name in names or (first and at0 in names) for names, first in held):
            complete.append(row)  # a store profile may hold a level for some shards only: no way to fetch it all
    return sorted(complete, key=lambda r: (r["name"] == "fp16", r["bytes"]))


def floor_level(rows: list[dict], floor_db: float) -> dict | None:
    """The level a client picks as its quality floor from ``rows`` (of :func:`level_totals`): the cheapest whose
    ``psnr_db`` reaches ``floor_db``, fp16 only when nothing cheaper does; None when none does."""
    ok = [r for r in rows if r["psnr_db"] is not None and r["psnr_db"] >= floor_db]
    return min(ok, key=lambda r: (r["name"] == "fp16", r["bytes"])) if ok else None


def storage(manifest: dict) -> dict:
    """What a template occupies in a store: ``stored_bytes`` (every blob once: a progressive level's chain shares the
    blobs of the levels below it), ``fp16_bytes`` (its uncompressed KV: every shard's fp16 representation) and
    ``x_fp16``, their ratio (> 1: the store holds more than the uncompressed KV, e.g. a ladder beside the fp16)."""
    blobs = {r["digest"]: r["bytes"] for sh in manifest["shards"] for r in sh["representations"]}
    fp16 = sum(r["bytes"] for sh in manifest["shards"] for r in sh["representations"] if r["name"] == "fp16")
    stored = sum(blobs.values())
    return {"stored_bytes": stored, "fp16_bytes": fp16, "x_fp16": round(stored / fp16, 3) if fp16 else None}


def bytes_at_psnr(rows: list[dict], psnr_db: float) -> float | None:
    """Bytes a ladder (rows of :func:`level_totals`) needs for ``psnr_db``: log-bytes interpolated linearly in dB
    between its levels; ``None`` outside the ladder's range."""
    pts = sorted((r["psnr_db"], r["bytes"]) for r in rows if r["psnr_db"] is not None and r["bytes"] > 0)
    for (p0, b0), (p1, b1) in zip(pts, pts[1:], strict=False):
        if p0 <= psnr_db <= p1:
            f = 0.0 if p1 == p0 else (psnr_db - p0) / (p1 - p0)
            return float(np.exp(np.log(b0) + f * (np.log(b1) - np.log(b0))))
    return None


def compare_to_single(per_step: dict, single: dict, floor_psnr_db: float = 35.0) -> dict:
    """A per-step manifest's bytes against the single-mode template's, at equal end-to-end PSNR: per level, the
    single-mode bytes interpolated at that level's PSNR and the ratio; the floor levels (cheapest with
    ``psnr_db >= floor_psnr_db``) of both; and the total stored bytes of both."""
    ps_rows, single_rows = level_totals(per_step), level_totals(single)
    for r in ps_rows:
        b = None if r["psnr_db"] is None else bytes_at_psnr(single_rows, r["psnr_db"])
        r["single_bytes_at_psnr"] = None if b is None else int(round(b))
        r["x_single"] = None if b is None else round(r["bytes"] / b, 3)

    fp, fs = floor_level(ps_rows, floor_psnr_db), floor_level(single_rows, floor_psnr_db)
    sp, ss = storage(per_step)["stored_bytes"], storage(single)["stored_bytes"]
    return {
        "levels": ps_rows,
        "single_levels": single_rows,
        "floor": {
            "per_step": fp,
            "single": fs,
            "x_single": None if not (fp and fs) else round(fp["bytes"] / fs["bytes"], 3),
        },
        "stored_bytes": {"per_step": sp, "single": ss, "x_single": round(sp / ss, 3)},
    }
