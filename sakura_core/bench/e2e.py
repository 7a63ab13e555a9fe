"""End-to-end benchmark: every policy over every trace (simulation at phone scale) or over a shaped link (live).

``sim`` mode is a SIMULATION: shard sizes, decode speeds and distortions are measured in the same run on the demo
model's real KV (every codec, every level), then scaled to the phone-class DiT of
:mod:`sakura_core.runtime.profiles` and replayed over each trace with a device profile.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ..fetch.traces import Trace
from ..metrics import psnr_tokens as psnr_db
from ..models.edit_model import EditModel
from ..models.kv_types import TemplateKV
from ..policy.ladder import Level
from ..policy.policies import make_policy
from ..runtime.denoise import run_edit
from ..runtime.oracle import fluid_bound, simulate_oracle
from ..runtime.profiles import PHONE_DIT, DeviceProfile, DitGeometry
from ..runtime.simulate import SimConfig, kv_mode_view, simulate
from .e2e_summary import FLUID_BOUND, summarize, summarize_by_class  # the summaries: re-exported here
from .phone_scale import measure_phone_decode

__all__ = [
    "CodecLevel",
    "build_phone_ladders",
    "cross_step_sakura",
    "measure_codec_levels",
    "quality_floor",
    "psnr_db",
    "run_sim",
    "summarize",
    "summarize_by_class",
]

logger = logging.getLogger(__name__)

PSNR_TARGET_DB = 35.0
SIM_CODECS = {"sakura": "sakura", "cachegen": "cachegen", "fp16": "fp16"}


class CodecLevel(dict):
    """One measured (codec, level): family, codec, level, name, bytes, ratio_vs_fp16, psnr_db, progressive,
    decode_bytes_per_s (demo shards), phone_decode_bytes_per_s (a phone-scale shard; what the simulation uses)."""


def measure_codec_levels(
    model: EditModel, template: np.ndarray, user: np.ndarray, prompt: str, steps: int, progress=None
) -> list[CodecLevel]:
    """Encode the template's KV with every codec in ``SIM_CODECS``, decode every level (timed, one thread) and
    run the edit with it; PSNR is against the exact-KV edit."""
    from ..kv import decode_kv, level_chains
    from ..precompute import precompute_template

    torch.set_num_threads(1)
    exact_kv = model.adapter.extract_template_kv(model.template_tokens(template), model.spec.grid)
    exact = run_edit(model, user, prompt, steps=steps, kv_source=exact_kv).tokens
    fp16_bytes = exact_kv.nbytes // (exact_kv.kv.element_size() // 2)
    rows: list[CodecLevel] = []
    for family, codec in SIM_CODECS.items():
        # psnr_steps=0: this benchmark measures each level's PSNR itself, on its own edit
        pre = precompute_template(model, template, f"bench-{family}", codec=codec, psnr_steps=0)
        shards = pre.manifest["shards"]
        reps = sorted(shards[0]["representations"], key=lambda r: r["level"])
        for name, level in [(r["name"], r["level"]) for r in reps]:
            if family != "fp16" and name == "fp16":
                continue  # the exact extra representation: measured under the fp16 family
            chains = level_chains(shards, pre.blobs, name)
            total_bytes = sum(len(blob) for chain in chains for blob in chain)
            t0 = time.perf_counter()
            decoded = decode_kv(chains)  # (layers, 2, tokens, heads, head_dim) fp16
            decode_s = time.perf_counter() - t0
            kv = TemplateKV(decoded.float(), exact_kv.model_id, exact_kv.token_grid, exact_kv.rope_layout)
            out = run_edit(model, user, prompt, steps=steps, kv_source=kv).tokens
            row = CodecLevel(
                family=family,
                codec=codec,
                level=level,
                name=name,
                bytes=total_bytes,
                ratio_vs_fp16=fp16_bytes / total_bytes,
                decode_bytes_per_s=fp16_bytes / max(decode_s, 1e-9),
                psnr_db=psnr_db(out, exact),
                progressive=any(r.get("requires") for r in shards[0]["representations"]),
            )
            rows.append(row)
            if progress:
                progress(f"{family}/{name}: ratio {row['ratio_vs_fp16']:.2f}x, PSNR {row['psnr_db']:.1f} dB")
    measure_phone_decode(rows, exact_kv.kv[0].float().numpy())  # (2, tokens, heads, head_dim) of layer 0
    if progress:
        for r in rows:
            progress(f"{r['family']}/{r['name']}: decode {r['phone_decode_bytes_per_s'] / 1e6:.0f} MB/s on a "
                     f"phone-scale shard {r['phone_shard']}")  # fmt: skip
    return rows


def quality_floor(psnr_db_by_level: list[float], target_db: float) -> int:
    """Index of the cheapest level (levels listed cheapest first) whose PSNR meets ``target_db``; if none does,
    the level with the highest PSNR (the closest any representation of that codec gets)."""
    if not psnr_db_by_level:
        raise ValueError("quality_floor needs at least one level")
    ok = [i for i, p in enumerate(psnr_db_by_level) if p >= target_db]
    if ok:
        return ok[0]
    best = max(range(len(psnr_db_by_level)), key=psnr_db_by_level.__getitem__)
    logger.warning(
        "no level reaches %.1f dB (best %.1f dB): floor at the best level", target_db, psnr_db_by_level[best]
    )
    return best


def build_phone_ladders(rows: list[CodecLevel], geometry: DitGeometry = PHONE_DIT) -> tuple[dict, dict]:
    """Per-layer ladders at phone scale from the measured levels; floors = cheapest level meeting the PSNR target,
    the same rule for sakura and cachegen (a family with no level that meets it gets its best level); fp16: 0.
    Shard bytes come from ``geometry``, ratios and PSNR from the measured levels, decode times from the throughput
    measured on a phone-scale shard (the demo-shard throughput when a row lacks it)."""
    shard_fp16, layers = geometry.shard_bytes_fp16, geometry.layers
    ladders, floors = {}, {}
    for family in SIM_CODECS:
        fam = sorted((r for r in rows if r["family"] == family), key=lambda r: -r["ratio_vs_fp16"])
        if family == "sakura":
            fam = fam + [r for r in rows if r["family"] == "fp16"]
        levels, prev = [], 0
        for r in fam:
            nbytes = int(round(shard_fp16 / r["ratio_vs_fp16"]))
            prog = bool(r["progressive"]) and r["family"] == family and nbytes > prev
            levels.append(
                Level(
                    name=r["name"],
                    nbytes=nbytes,
                    increment_bytes=nbytes - prev if prog else nbytes,
                    decode_s=shard_fp16 / r.get("phone_decode_bytes_per_s", r["decode_bytes_per_s"]),
                    mse=4 * 10 ** (-r["psnr_db"] / 10) / layers,
                    progressive=prog,
                )
            )
            prev = nbytes
        ladders[family] = [levels] * layers
        floors[family] = quality_floor([r["psnr_db"] for r in fam], PSNR_TARGET_DB)
    return ladders, floors


def cross_step_sakura(lad, geometry: DitGeometry) -> tuple[list, int]:
    """SAKURA's per-step ladders (steps x layers shards of ``geometry``) from the per-step measurement shipped in
    ``per_step_ladders.json`` (cross-step coded per-step KV: step s's bytes and the PSNR of every level), each level's
    decode time from ``lad`` (the geometry's :class:`~sakura_core.runtime.sim_ladders.ShardLadders`: its sakura
    family at the same level name); and the floor (cheapest level with PSNR >= 35 dB)."""
    from .per_step_ladders import load, per_step_ladders

    data = load()
    if data["steps"] != geometry.steps:
        raise ValueError(f"per_step_ladders.json is measured for {data['steps']} steps, {geometry.name} runs "
                         f"{geometry.steps}: measure it for this schedule or use --per-step-ladders single")  # fmt: skip
    fam = lad.families["sakura"]
    speed = {name: geometry.shard_bytes_fp16 / fam.decode_s[0][j] for j, name in enumerate(fam.levels)}
    missing = [lv["name"] for lv in data["levels"] if lv["name"] not in speed]
    if missing:
        raise ValueError(f"per_step_ladders.json names levels {missing} the {lad.geometry} ladders do not have "
                         f"({list(fam.levels)}): re-measure the ladders (delete the file) or per_step_ladders.json")  # fmt: skip
    ladders = per_step_ladders(data, geometry.shard_bytes_fp16, geometry.layers, speed)
    return ladders, quality_floor([lv["psnr_db"] for lv in data["levels"]], PSNR_TARGET_DB)


def run_sim(
    traces: list[Trace],
    policies: list[str],
    profile: DeviceProfile,
    ladders: dict,
    floors: dict,
    starts_per_trace: int = 3,
    progress=None,
    kv_mode: str = "single",
    config: SimConfig | None = None,
) -> list[dict]:
    """Every policy on every trace at ``starts_per_trace`` evenly spaced start offsets (the trace's length split in
    equal parts). ``ladders`` must match the shard count (``kv_mode_view(profile, kv_mode).model``: steps x layers
    shards in per-step mode); the simulator runs the real protocol on ``profile`` (one split per step in per-step
    mode) with ``config`` (planning charges). Each (trace, start) also gets a ``fluid-bound`` row: the fluid lower
    bound (:func:`~sakura_core.runtime.oracle.fluid_bound`)."""
    kv_mode_view(profile, kv_mode)  # validates kv_mode
    runs = []
    for trace in traces:
        for i in range(starts_per_trace):
            start = trace.period_s * i / starts_per_trace
            bound = fluid_bound(trace, kv_mode_view(profile, kv_mode), ladders, floors, start)
            runs.append({"trace": trace.name, "trace_class": trace.trace_class or "other", "start_s": round(start, 3),
                         "policy": FLUID_BOUND, "latency_s": bound, "bytes_fetched": 0, "psnr_db": float("nan"),
                         "split_layer": 0, "splits": [], "peak_kv_bytes": 0})  # fmt: skip
            for name in policies:
                pol = make_policy(name)
                sim = simulate_oracle if name == "oracle" else simulate
                r = sim(pol, trace, profile, ladders, floors, start, config)
                runs.append(
                    {
                        "trace": trace.name,
                        "trace_class": trace.trace_class or "other",
                        "start_s": round(start, 3),
                        "policy": name,
                        "latency_s": float(r.latency_s),
                        "bytes_fetched": int(r.bytes_fetched),
                        "psnr_db": float(r.psnr_db),
                        "split_layer": int(r.split_layer),
                        "splits": [int(k) for k in r.splits],  # one per step in per-step mode
                        "peak_kv_bytes": int(r.peak_kv_bytes),  # decoded template KV held at once, at most
                        "planning_s": float(r.planning_s),  # the phone's time charged for the decisions
                        "decisions": int(r.decisions_timed),
                        "contention_s": float(r.contention_s),  # the DiT's loss to decode / planning threads
                        "_result": r,
                    }
                )
        if progress:
            progress(f"trace {trace.name}: {len(policies)} policies x {starts_per_trace} starts")
    return runs
