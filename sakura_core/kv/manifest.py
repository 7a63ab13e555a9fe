"""Template manifest (JSON, version 2): what a client needs to choose and fetch representations shard by shard.

Schema::

    {
      "version": 2,                                # 1 (shard format 1: no step, no reference): refused
      "model_id": hex content id of the model,
      "template_id": "[a-z0-9-]{1,64}",
      "token_grid": [rows, cols],
      "rope_layout": str,                          # "flux2-ref-t10" (one reference) or "flux2-ref-t10-xN" (N)
      "references": [                              # optional for one reference; in the model's order
        {"name": str,                              # optional, 1-64 characters (shown by the nodes)
         "size": [S, S], "token_grid": [rows, cols],   # the image as the KV was computed from it, its tokens
         "rope_t": 10 (i + 1), "token_offset": int, "tokens": rows * cols,  # its RoPE time, where its tokens start
         "image": {"digest", "bytes", "format"}}   # the publisher's: the exact PNG (template_image = the first's)
      ],
      "num_layers": int, "heads": int, "head_dim": int,
      "codec": the ladder's codec ("sakura", "cachegen", ...),
      "distortion_metric": "attn_rel_err" (relative error of the attention output on held-out probe requests),
      "kv_mode": "single" | "per-step"             # optional; absent = "single" (one KV per layer, every step)
      "store_profile": "serving" | "full"          # optional; absent = "full" (every representation, fp16 included)
      "schedule": {"steps": S, "timesteps": [t_0, .., t_{S-1}], "shift": float, "guidance": float | null,
                   "sampler": "flow-euler"}        # per-step only: the schedule the KV is valid for
      "shards": [                                  # in execution order, covering layers 0..num_layers-1
        {"layers": [first, last],                  # (per-step: step-major, each step covering every layer)
         "step": s,                                # per-step only: the sampler step (t = timesteps[s]); single: absent
         "exact_digest": str,                      # per-step, optional: the fp16 digest when that blob is not stored
         "representations": [                      # ascending level = ascending size and quality
           {"level": int, "name": str, "codec": str,
            "bytes": size of this blob alone,
            "total_bytes": bytes of this blob plus every blob it requires (what fetching it from nothing costs),
            "distortion": measured attention-output relative error of the decoded chain (0 = exact),
            "digest": sha256 hex of the blob (its name: GET /v1/shards/{digest}),
            "requires": [digests of the lower-level blobs this one refines, base first; [] for a base],
            "psnr_db": measured end-to-end PSNR of an edit with every shard at this level (optional),
            "ref": per-step only, optional: {"mode": "residual" | "reuse" | "closed", "step": r, "digest": fp16
                   digest of the shard (r, same layers)} — the shard that must be decoded first (a "reuse"
                   representation: bytes 0, digest null, requires []; a "closed" twin "<level>+cl": the digest of
                   the one representation of that shard it decodes against; see manifest_schema.py)}
         ]}
      ]
    }

A progressive representation at level j is decoded from ``requires + [digest]`` in that order. The fp16
representation (codec "fp16", the highest level, ``requires == []``) is always present, so a client can always get
the exact KV. A ``per-step`` manifest holds S x (layer ranges) shards, keyed by (step, layers); a request whose
step count or schedule differs from ``schedule`` is refused by :func:`check_schedule`. The publisher adds
``"template_image": {"digest", "bytes"}``, the template image as a blob (the device computes template layers from it).
A template of several reference images (try-on: person + garment) is one KV block over all of them: ``token_grid``
is their grids stacked, ``rope_layout`` says how many (:mod:`sakura_core.models.ref_layout`), and ``references``
lists each with its image; a manifest without ``references`` has one, its ``template_image``.

:func:`parse_manifest` is the one validation (field by field in :mod:`sakura_core.kv.manifest_schema`): it builds a
typed :class:`Manifest` once, where the JSON enters (the shard client, a local store, the publisher); everything after
reads the typed fields and never validates again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ..models.kv_types import KV_MODES
from .manifest_leaves import BlobRef, CrossStepRef, Reference, Representation, Schedule, Shard, shard_from_json
from .manifest_limits import ManifestLimitError, check_geometry_limits, check_steps_limit, check_value_limits
from .manifest_schema import (
    MANIFEST_VERSION,
    REF_MODES,
    ManifestError,
    ModelMismatchError,
    check_blob_ref,
    check_header,
    check_references,
    check_schedule_field,
    check_shards,
    manifest_kv_mode,
    version_problem,
)
from .storage import manifest_store_profile

__all__ = [
    "KV_MODES",
    "MANIFEST_VERSION",
    "REF_MODES",
    "BlobRef",
    "CrossStepRef",
    "Manifest",
    "ManifestError",
    "ManifestLimitError",
    "ModelMismatchError",
    "Reference",
    "Representation",
    "Schedule",
    "ScheduleMismatchError",
    "Shard",
    "as_manifest",
    "blob_digests",
    "check_schedule",
    "manifest_kv_mode",
    "parse_manifest",
    "shards_for_step",
    "validate_manifest",
    "version_problem",
]


class ScheduleMismatchError(ValueError):
    """A per-step template's KV was computed for another sampler schedule than the request's (see check_schedule)."""


@dataclass(frozen=True)
class Manifest:
    """A manifest that passed the schema (built by :func:`parse_manifest` only), typed to the leaves
    (:mod:`.manifest_leaves`); its JSON (to serve or store it) is :meth:`to_json`.

    Attributes:
        model_id, template_id: hex content id of the model; the template's id.
        token_grid: (rows, cols) of the template's tokens.
        rope_layout: position-id layout of the template tokens.
        num_layers, heads, head_dim: the KV's geometry.
        codec: the ladder's codec.
        kv_mode: ``"single"`` (one KV per layer, any schedule) or ``"per-step"`` (one per (step, layer)).
        schedule: the schedule per-step KV is valid for; None in single mode.
        template_image: the template image blob the publisher added, or None (the first reference's image).
        references: the template's reference images in order (one for a manifest without ``references``).
        store_profile: what the store keeps of it: ``"full"`` (every representation, the fp16 included; also a
            manifest without the field) or ``"serving"`` (the rungs a client fetches: :mod:`.storage`).
        shards: in execution order (per-step: step-major), each with its representations.
    """

    _json: dict = field(repr=False, compare=False)  # the JSON as received: only to_json() reads it
    model_id: str
    template_id: str
    token_grid: tuple[int, int]
    rope_layout: str
    num_layers: int
    heads: int
    head_dim: int
    codec: str
    kv_mode: str
    schedule: Schedule | None = None
    template_image: BlobRef | None = None
    references: tuple[Reference, ...] = ()
    store_profile: str = "full"
    shards: tuple[Shard, ...] = field(default=(), repr=False)

    @property
    def ref_grids(self) -> tuple[tuple[int, int], ...]:
        """Each reference's token grid, in order."""
        return tuple(r.token_grid for r in self.references)

    def to_json(self) -> dict:
        """The manifest's JSON object as it was received (the wire format, every field kept): a copy, the one way
        to the JSON past the parse (to serve, store or summarize it)."""
        return copy.deepcopy(self._json)

    @property
    def schedule_label(self) -> str:
        """What the KV is valid for: ``"any schedule"`` (single mode) or ``"4 steps, shift 1"`` (per-step)."""
        return "any schedule" if self.schedule is None else self.schedule.label

    def expect(self, *, template_id: str | None = None, model_id: str | None = None) -> Manifest:
        """Self, when it is the template asked for and was computed for ``model_id`` (either None: not checked);
        else ``ManifestError`` (another template) or ``ModelMismatchError`` (another model)."""
        if template_id is not None and self.template_id != template_id:
            raise ManifestError(
                f"manifest field 'template_id' is {self.template_id!r} but template {template_id!r} was asked for"
            )
        if model_id is not None and self.model_id != model_id:
            raise ModelMismatchError(
                f"template {self.template_id!r} was computed for model {self.model_id}, not for the model in use "
                f"({model_id}); precompute it for this model"
            )
        return self


def parse_manifest(manifest: Any, *, template_id: str | None = None, model_id: str | None = None) -> Manifest:
    """The one validation of a manifest: the schema (:mod:`.manifest_schema`: version, ids, grid, shards covering
    layers 0..L-1 in order (per step), representations with level, name, bytes, distortion, digest, requires chains,
    the per-step schedule, the template image reference, the references), then the template and model asked for
    (:meth:`Manifest.expect`). Returns the typed :class:`Manifest`; raises ``ManifestError`` naming the bad field."""
    header = check_header(manifest)
    check_geometry_limits(header)  # the bounds (sakura_core.limits), before anything is sized from the header
    per_step = header["kv_mode"] == "per-step"
    schedule = Schedule(**check_schedule_field(manifest.get("schedule"))) if per_step else None
    if schedule is not None:
        check_steps_limit(schedule.steps)
    if schedule is None and manifest.get("schedule") is not None:
        raise ManifestError("manifest field 'schedule' is only for kv_mode 'per-step' (single-mode KV fits any)")
    check_shards(manifest.get("shards"), header["num_layers"], schedule.steps if schedule is not None else None)
    image = check_blob_ref(manifest.get("template_image"))
    check_value_limits(manifest, header)
    refs = tuple(
        Reference(**{**r, "image": None if r["image"] is None else BlobRef(*r["image"])})
        for r in check_references(manifest, header["token_grid"], header["rope_layout"])
    )
    shards = tuple(shard_from_json(sh) for sh in manifest["shards"])
    parsed = Manifest(
        _json=manifest,
        shards=shards,
        schedule=schedule,
        template_image=None if image is None else BlobRef(*image),
        references=refs,
        store_profile=manifest_store_profile(manifest),
        **header,
    )
    return parsed.expect(template_id=template_id, model_id=model_id)


def as_manifest(manifest: Manifest | dict) -> Manifest:
    """``manifest`` typed: itself when parsed already, else :func:`parse_manifest` of the JSON object (where a caller
    holds the JSON it built, a benchmark or a test)."""
    return manifest if isinstance(manifest, Manifest) else parse_manifest(manifest)


def validate_manifest(manifest: Any) -> None:
    """:func:`parse_manifest` for a caller that only needs the verdict: ``ManifestError`` naming the first bad field,
    else ``None``."""
    parse_manifest(manifest)


def blob_digests(manifest: Manifest | dict) -> list[str]:
    """The digest of every representation that has a blob (not the zero-byte cross-step ``reuse`` ones), in manifest
    order; the blobs their ``requires`` name are among them (a chain stays within its shard). ``manifest``: typed, or
    the JSON as a publisher builds it or a store check reads it (not parsed: a manifest the schema refuses still names
    its blobs)."""
    if isinstance(manifest, Manifest):
        return [r.digest for shard in manifest.shards for r in shard.representations if r.digest]
    return [rep["digest"] for shard in manifest["shards"] for rep in shard["representations"] if rep.get("digest")]


def shards_for_step(manifest: dict, step: int) -> list[dict]:
    """The shards the request's step ``step`` injects, in layer order: every shard for a single-mode template (its KV
    serves all steps), the shards keyed ``step`` for a per-step one."""
    if manifest_kv_mode(manifest) == "single":
        return list(manifest["shards"])
    steps = manifest["schedule"]["steps"]
    if not 0 <= step < steps:
        raise IndexError(
            f"step {step} out of range: template {manifest.get('template_id')!r} has steps 0..{steps - 1}"
        )
    return [sh for sh in manifest["shards"] if sh["step"] == step]


def check_schedule(
    manifest: Manifest | dict,
    steps: int,
    shift: float,
    timesteps: list[float] | None = None,
    guidance: float | None = None,
    tol: float = 1e-6,
) -> None:
    """Refuse a request whose sampler schedule differs from the one a per-step template's KV was computed for.

    ``timesteps``: the times the request runs its steps at (``runtime.schedule.edit_times(model, steps)[:-1]``, the
    model's own schedule). Single-mode KV is valid for any schedule (nothing is checked). The error names both
    schedules and the fixes: run with the template's steps/shift, precompute the template for the request's
    schedule, or compute the template on the device.
    """
    m = as_manifest(manifest)
    sched, tid = m.schedule, m.template_id
    if sched is None:
        return
    if sched.steps != steps:
        raise ScheduleMismatchError(
            f"template {tid!r} was precomputed for {sched.steps} steps (shift {sched.shift:g}, per-step KV); "
            f"the edit asks {steps} — set steps to {sched.steps} or precompute the template with "
            f"--kv-mode per-step --steps {steps}"
        )
    theirs = f"{sched.steps} steps, shift {sched.shift:g}, guidance {sched.guidance}"
    ours = f"{steps} steps, shift {shift:g}, guidance {guidance}"
    bad = abs(sched.shift - shift) > tol or sched.guidance != guidance
    if not bad and timesteps is not None:
        bad = len(timesteps) != steps or any(
            abs(a - b) > tol for a, b in zip(timesteps, sched.timesteps, strict=False)
        )
        if bad:
            ours += f", t={[round(float(t), 4) for t in timesteps]} vs the template's {list(sched.timesteps)}"
    if bad:
        raise ScheduleMismatchError(
            f"template {tid!r} holds per-step KV for {theirs}, but this request runs {ours}; "
            f"run with --steps {sched.steps} --shift {sched.shift:g}, precompute the template for this schedule "
            f"(sakura precompute --kv-mode per-step --steps {steps} --shift {shift:g}), or compute the template on the "
            "device"
        )
