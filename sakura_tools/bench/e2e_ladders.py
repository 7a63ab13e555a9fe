"""The ladders ``sakura bench e2e --mode sim`` simulates each (geometry, KV mode) with: read from ``--ladders DIR``
(``<geometry>.<kv_mode>.json``, :class:`~sakura_core.runtime.sim_ladders.ShardLadders`) or measured now
(:mod:`.geometry_ladders`) and written there; and the one-line summaries the tables' headers print."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sakura_core.files import atomic_write_json
from sakura_core.runtime.geometry import get_geometry
from sakura_core.runtime.sim_ladders import ShardLadders

from .geometry_ladders import LadderConfig, demo_ladders, geometry_ladders, size_effects

__all__ = ["QUIET_LOAD_PER_CORE", "ladder_file", "ladder_lines", "load_note", "load_or_measure_ladders"]


def ladder_file(folder: str | Path, geometry: str, kv_mode: str) -> Path:
    return Path(folder) / f"{geometry}.{kv_mode}.json"


def load_or_measure_ladders(
    pairs: list[tuple[str, str]],
    folder: str | None,
    cfg: LadderConfig,
    model_fn: Callable,
    say: Callable[[str], None] = print,
) -> dict[tuple[str, str], ShardLadders]:
    """(geometry, kv_mode) -> ladders: the file in ``folder`` when there is one, else measured (on the demo model
    ``model_fn()``; once per KV mode, the size effects once per geometry) and written to ``folder``."""
    out, missing = {}, []
    for geometry, kv_mode in pairs:
        path = ladder_file(folder, geometry, kv_mode) if folder else None
        if path is not None and path.exists():
            try:
                out[(geometry, kv_mode)] = ShardLadders.from_dict(json.loads(path.read_text()))
            except (OSError, ValueError) as e:
                raise SystemExit(
                    f"sakura bench e2e: cannot read ladders {path}: {e}; delete it to measure again"
                ) from e
            say(f"ladders {geometry} {kv_mode}: read {path}")
            note = load_note(out[(geometry, kv_mode)].source)
            if note:
                say(f"ladders {geometry} {kv_mode}: {note}")
        else:
            missing.append((geometry, kv_mode))
    if not missing:
        return out
    model = model_fn()
    demos = {}
    # the size effects are the codecs' at the geometry's shard size: reuse those a file of the geometry measured
    effects = {g: lad.source["size_effects"] for (g, _), lad in out.items() if "size_effects" in lad.source}
    loads = {g: lad.source.get("load_average") for (g, _), lad in out.items() if "size_effects" in lad.source}
    for geometry, kv_mode in missing:
        g = get_geometry(geometry)
        if kv_mode not in demos:
            say(f"measuring {kv_mode} ladders on the demo model ({model.weights_source}) ...")
            demos[kv_mode] = demo_ladders(model, cfg, kv_mode, say)
        if geometry not in effects:  # measured on step 0's KV (per-step) or the single-mode KV
            say(
                f"measuring codec size effects at {geometry}'s shard size ({g.template_tokens} tokens x {g.width}) ..."
            )
            before = os.getloadavg()[0]
            effects[geometry] = size_effects(demos[kv_mode], g, cfg, say)
            loads[geometry] = [round(before, 2), round(os.getloadavg()[0], 2)]
        source = {
            "measured_on": f"demo model ({model.weights_source}), templates {', '.join(cfg.templates[: g.references])}"
            f", user {cfg.user}, {cfg.steps} steps; level PSNR the lowest of that edit and the manifest's held-out"
            " edits",
            "shard_size": [g.template_tokens, g.heads, g.head_dim],
            "synthesised_demo_layers": list(cfg.synth_layers),
            "size_effects": effects[geometry],
            "host_cpu": platform.processor() or platform.machine(),
            "load_average": loads.get(geometry),
            "cpu_count": os.cpu_count(),
            "method": "sakura_tools.bench.geometry_ladders (module docstring)",
        }
        if note := load_note(source):
            say(f"ladders {geometry} {kv_mode}: {note}")
        lad = geometry_ladders(demos[kv_mode], effects[geometry], g, kv_mode, source)
        out[(geometry, kv_mode)] = lad
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            atomic_write_json(ladder_file(folder, geometry, kv_mode), lad.as_dict())
            say(f"ladders {geometry} {kv_mode}: wrote {ladder_file(folder, geometry, kv_mode)}")
    return out


#: Above this 1-minute load average per core the decode timings of a ladder file run slow: a busy machine stretches
#: every codec's decode CPU time, which flatters sakura against the decode-bound cachegen.
QUIET_LOAD_PER_CORE = 0.75


def load_note(source: dict) -> str | None:
    """A warning when a ladder file's decode times were measured on a busy machine (``source["load_average"]``:
    the 1-minute load average before and after timing them; ``source["cpu_count"]``), or when the file does not
    say."""
    loads = source.get("load_average")
    if not loads:
        return "decode times measured at an unrecorded load average (delete the file to re-measure on a quiet machine)"
    quiet = QUIET_LOAD_PER_CORE * (source.get("cpu_count") or 2)
    if max(loads) > quiet:
        return (
            f"decode times measured at load average {max(loads):.1f} (above {quiet:.1f}): every codec decodes "
            f"slower there, which flatters sakura against the decode-bound cachegen; delete the file to re-measure "
            f"on a quiet machine"
        )
    return None


def ladder_lines(lad: ShardLadders, fp16_shard_bytes: int, slowdown: float = 1.0) -> list[str]:
    """Per family: each level's mean ratio vs fp16 over the shards (min-max), edit PSNR, decode MB/s; the floor."""
    lines = []
    for name, fam in lad.families.items():
        b = np.array(fam.bytes, dtype=float)  # (shards, levels)
        d = np.array(fam.decode_s, dtype=float) * slowdown
        psnr = fam.psnr_db()
        parts = []
        for j, lv in enumerate(fam.levels):
            r = fp16_shard_bytes / b[:, j]
            mark = "*" if j == fam.floor else ""
            parts.append(
                f"{lv}{mark} {fp16_shard_bytes / b[:, j].mean():.2f}x ({r.min():.2f}-{r.max():.2f}) "
                f"{psnr[j]:.1f} dB {fp16_shard_bytes / d[:, j].mean() / 1e6:.0f} MB/s"
            )
        lines.append(f"  {name}: " + "; ".join(parts))
    return lines
