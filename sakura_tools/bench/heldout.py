"""Does a manifest's ``psnr_db`` hold on edits precompute never saw? (``sakura bench heldout``)

Precompute measures every level's end-to-end PSNR on a few held-out edits (probe crops, generic prompts:
:func:`~sakura_core.precompute.output_psnr.manifest_psnr_edits`; the manifest keeps the lowest), and a client picks
its quality floor by it (the cheapest level >= 35 dB, :func:`~sakura_core.precompute.cross_step.floor_level`). This
bench precomputes each template as ``sakura precompute`` does and measures every level again on other users' images,
prompts and seeds (each template edited with the other sample images): per level the manifest's PSNR beside the
held-out minimum / median / maximum, and per template whether the level a client picks as its floor still reaches
the floor on every held-out edit. In per-step mode the floor is picked on the
closed-loop twins' track as the client does (the cheapest level of either family whose manifest PSNR reaches it).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sakura_core.models.edit_model import EditModel, load_image
from sakura_core.precompute import precompute_template
from sakura_core.precompute.cross_step import floor_level, level_totals
from sakura_core.precompute.output_psnr import PSNR_METRIC, level_psnr
from sakura_core.precompute.template import template_kvs

__all__ = ["HeldOutConfig", "heldout_command", "run_heldout"]

SAMPLES = ("astronaut", "coffee", "chelsea", "rocket")


@dataclass(frozen=True)
class HeldOutConfig:
    templates: tuple[str, ...] = SAMPLES
    users: tuple[str, ...] = SAMPLES  # a template is never its own user
    prompts: tuple[str, ...] = ("place it in the marked region", "swap the face")
    kv_mode: str = "per-step"
    steps: int = 4
    seed: int = 11  # held-out edits use seed, seed + 1, ...; precompute's own edits use seeds 0-2
    floor_db: float = 35.0

    def __post_init__(self) -> None:
        if self.kv_mode not in ("single", "per-step"):
            raise ValueError(f"kv_mode must be 'single' or 'per-step', got {self.kv_mode!r}")
        if not self.templates or not self.prompts:
            raise ValueError("give at least one template and one prompt")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        for t in self.templates:
            if not [u for u in self.users if u != t]:
                raise ValueError(f"template {t!r} has no user image other than itself: add one to --users")


def heldout_command(cfg: HeldOutConfig, json_path: str, weights: str = "auto") -> str:
    """The ``sakura bench heldout`` command that runs ``cfg`` (options at their defaults left out)."""
    d, parts = HeldOutConfig(), ["sakura bench heldout", f"--kv-mode {cfg.kv_mode}"]
    for flag, value, default, sep in (
        ("--templates", cfg.templates, d.templates, ","),
        ("--users", cfg.users, d.users, ","),
        ("--prompts", cfg.prompts, d.prompts, "|"),
    ):
        if value != default:
            parts.append(f"{flag} {shlex.quote(sep.join(value))}")
    for flag, number, number_default in (
        ("--steps", cfg.steps, d.steps),
        ("--seed", cfg.seed, d.seed),
        ("--floor-db", cfg.floor_db, d.floor_db),
    ):
        if number != number_default:
            parts.append(f"{flag} {number:g}")
    if weights != "auto":
        parts.append(f"--weights {shlex.quote(weights)}")
    return " ".join([*parts, f"--json {shlex.quote(json_path)}"])


def _family(name: str) -> str:
    if name.endswith("+cl"):
        return "closed-loop twins"
    return name if name in ("fp16", "reuse") else "levels"


def run_heldout(
    model: EditModel, cfg: HeldOutConfig, say: Callable[[str], None] = print, extra_edits: list | None = None
) -> dict:
    """Rows (template x level: bytes, manifest PSNR, held-out PSNRs) and per-template floors; ``extra_edits``
    ((user image, prompt, seed) tuples) are added to every template's held-out edits (tests)."""
    size = model.spec.image_size
    rows, floors = [], []
    for t in cfg.templates:
        image = load_image(t, size)
        say(f"template {t}: precompute ({cfg.kv_mode}, {cfg.steps} steps) ...")
        pre = precompute_template(model, image, f"heldout-{t}", kv_mode=cfg.kv_mode, steps=cfg.steps)
        per_step, kvs = template_kvs(model, image, cfg.kv_mode, cfg.steps, 1.0, lambda *a: None)
        kv = per_step if per_step is not None else kvs[0]
        users = [u for u in cfg.users if u != t]
        edits = [
            (load_image(u, size), p, cfg.seed + i)
            for i, (u, p) in enumerate((u, p) for u in users for p in cfg.prompts)
        ]
        edits += list(extra_edits or [])
        levels = level_totals(pre.manifest)
        say(f"template {t}: {len(levels)} levels x {len(edits)} held-out edits ...")
        psnr = level_psnr(model, kv, pre.manifest["shards"], pre.blobs, [r["name"] for r in levels], edits, cfg.steps)
        for r in levels:
            v = np.array(psnr[r["name"]])
            rows.append(
                {
                    "template": t,
                    "name": r["name"],
                    "family": _family(r["name"]),
                    "bytes": r["bytes"],
                    "manifest_psnr_db": r["psnr_db"],
                    "heldout_psnr_db": [round(float(x), 3) for x in v],
                    "heldout_min_db": round(float(v.min()), 3),
                    "heldout_median_db": round(float(np.median(v)), 3),
                    "heldout_max_db": round(float(v.max()), 3),
                }
            )
        floor = floor_level(levels, cfg.floor_db)
        name = floor and floor["name"]
        row = next((r for r in rows if r["template"] == t and r["name"] == name), None)
        floors.append(
            {
                "template": t,
                "floor": name,
                "bytes": row and row["bytes"],
                "manifest_psnr_db": row and row["manifest_psnr_db"],
                "heldout_min_db": row and row["heldout_min_db"],
                "holds": bool(row and row["heldout_min_db"] >= cfg.floor_db),
            }
        )
    return {
        "config": {
            **cfg.__dict__,
            "templates": list(cfg.templates),
            "users": list(cfg.users),
            "prompts": list(cfg.prompts),
            "manifest_psnr": PSNR_METRIC,
        },
        "rows": rows,
        "floors": floors,
        "families": _families(rows),
    }


def _families(rows: list[dict]) -> dict:
    """Per family: the largest shortfall of a held-out edit below its manifest PSNR (dB, over the lossy levels:
    fp16 and its ~80 dB rounding noise left out) and the median held-out - manifest difference."""
    out = {}
    for fam in sorted({r["family"] for r in rows} - {"fp16"}):
        d = [x - r["manifest_psnr_db"] for r in rows if r["family"] == fam for x in r["heldout_psnr_db"]]
        out[fam] = {"worst_shortfall_db": round(float(-min(d)), 3), "median_diff_db": round(float(np.median(d)), 3)}
    return out
