"""Per-shard ladders of a phone-scale geometry (what ``sakura bench e2e --mode sim`` simulates), measured.

SIMULATION INPUT, measured in two parts (:class:`~sakura_core.runtime.sim_ladders.ShardLadders` holds the result):

1. On the demo model's real template KV (every codec, every level, in the geometry's KV mode: per-step KV for
   ``per-step``, with importance probed at each step's time): each shard's bytes at each level, the PSNR with every
   shard at a level (the lowest over the configured edit and precompute's held-out edits, the manifest's
   ``psnr_db``: the simulator's quality floor rests on more than one edit), and each shard's share of that error
   (the configured edit with only that shard at the level, the shares scaled so they sum to the all-shards MSE).
2. At the geometry's own shard size (tokens x heads x head_dim): the codec's compression and decode speed depend on
   it (CacheGen ships a probability table per (layer, channel), SAKURA per-channel ranges: both cost less per value on
   a larger shard). Demo layers are *synthesised* to that size: each token of the large shard mixes two random demo
   tokens, ``mu + cos(a) (x_i - mu) + sin(a) (x_j - mu)`` per channel with a random angle ``a`` in [0, pi/2] (drawn
   per token and per block of the demo's channel count), so per-channel means and variances are the demo's while no
   token row, and no run of a row, repeats: zstd cannot exploit the tiling (exact tiling would hand it matches).
   The same synthesis at the demo's own size is encoded too; each level's *size factor* is the ratio at the
   geometry's size over the ratio at the demo's size (geometric mean over the synthesised layers), and the decode
   speed is timed on the large shard (CPU seconds of the decoding thread on this CPU, best of ``repeats``).

A geometry shard (step s, layer l) takes the demo shard of the same step (steps mapped proportionally) and of the
corresponding layer (double blocks to double blocks, single to single, proportionally): its bytes are
``fp16 bytes / (demo ratio x size factor)``, its decode time ``fp16 bytes / decode speed``, its MSE share the demo
shard's, divided among the geometry shards that map to it. Several references: the geometry's shard synthesises each
reference from another demo template's KV (the demo model has one reference; its references do not attend to each
other); ratios and PSNR come from the first template.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sakura_core.kv.chain import decode_chain
from sakura_core.kv.codec_registry import ShardInput, ShardMeta, get_codec
from sakura_core.kv.template_codec import decode_template
from sakura_core.metrics import psnr_tokens
from sakura_core.models.edit_model import EditModel, load_image
from sakura_core.models.kv_types import PerStepTemplateKV, TemplateKV
from sakura_core.runtime.denoise import run_edit
from sakura_core.runtime.geometry import DitGeometry
from sakura_core.runtime.schedule import edit_times
from sakura_core.runtime.sim_ladders import FamilyLadders, ShardLadders

__all__ = [
    "FAMILIES",
    "LadderConfig",
    "demo_ladders",
    "geometry_ladders",
    "manifest_psnr",
    "size_effects",
    "synthesize_shard",
]

FAMILIES = {"sakura": "sakura", "cachegen": "cachegen", "fp16": "fp16"}  # family -> codec
PSNR_FLOOR_DB = 35.0


@dataclass(frozen=True)
class LadderConfig:
    """What the ladders are measured on. templates: the demo templates (the first for ratios and PSNR, the others
    for a geometry's further references); user, prompt, steps: the held-out edit; synth_layers: the demo layers
    synthesised at the geometry's size; repeats: decode timings (best)."""

    templates: tuple[str, ...] = ("astronaut", "coffee", "rocket", "chelsea")
    user: str = "chelsea"
    prompt: str = "place it"
    steps: int = 4
    synth_layers: tuple[int, ...] = (0, 3)
    seed: int = 0
    repeats: int = 2


def _edit(model: EditModel, cfg: LadderConfig, kv, kv_mode: str, user) -> torch.Tensor:
    return run_edit(model, user, cfg.prompt, steps=cfg.steps, kv_source=kv, kv_mode=kv_mode).tokens


def _with_shard(exact, decoded, step: int | None, layer: int):
    """``exact`` with one shard (``layer``, and ``step`` for per-step KV) taken from ``decoded``."""
    kv = exact.kv.clone()
    if step is None:
        kv[layer] = decoded.kv[layer]
        return TemplateKV(kv, exact.model_id, exact.token_grid, exact.rope_layout, exact.ref_timestep)
    kv[step, layer] = decoded.kv[step, layer]
    return PerStepTemplateKV(kv, exact.model_id, exact.token_grid, exact.rope_layout, exact.timesteps)


def demo_ladders(model: EditModel, cfg: LadderConfig, kv_mode: str, say: Callable[[str], None] = print) -> dict:
    """Part 1 of the module docstring: per family, level names (cheapest first), per (demo) shard ratios vs fp16 and
    MSE shares, the all-shards PSNR per level; plus the exact KV of each template (for the synthesis)."""
    from sakura_core.precompute import precompute_template

    torch.set_num_threads(1)
    size, grid = model.spec.image_size, model.spec.grid
    images = [load_image(t, size) for t in cfg.templates]
    user = load_image(cfg.user, size)
    refs = [model.template_tokens(im) for im in images]
    exacts: list[TemplateKV | PerStepTemplateKV]
    if kv_mode == "per-step":
        times = edit_times(model, cfg.steps)[:-1]
        exacts = [model.adapter.extract_per_step_kv(r, grid, times) for r in refs]
    else:
        exacts = [model.adapter.extract_template_kv(r, grid) for r in refs]
    exact = exacts[0]
    ref_out = _edit(model, cfg, exact, kv_mode, user)
    L = model.adapter.num_layers
    steps = range(cfg.steps) if kv_mode == "per-step" else [None]
    shards = [(s, layer) for s in steps for layer in range(L)]
    fp16_shard = 2 * exact.kv.shape[-3] * exact.kv.shape[-2] * exact.kv.shape[-1] * 2
    out: dict[str, Any] = {
        "shards": len(shards),
        "layers": L,
        "steps": cfg.steps if kv_mode == "per-step" else 1,
        "families": {},
    }
    for family, codec in FAMILIES.items():
        # the manifest's psnr_db (precompute's held-out edits, the lowest kept) joins this edit's in the floor
        pre = precompute_template(
            model, images[0], f"bench-{family}", codec=codec, psnr_steps=cfg.steps, kv_mode=kv_mode, steps=cfg.steps
        )
        held_out = manifest_psnr(pre.manifest)
        reps0 = pre.manifest["shards"][0]["representations"]
        names = [r["name"] for r in sorted(reps0, key=lambda r: r["level"]) if family == "fp16" or r["name"] != "fp16"]
        by_slot = {
            ((sh.get("step") if kv_mode == "per-step" else None), sh["layers"][0]): sh for sh in pre.manifest["shards"]
        }
        levels = []
        for name in names:
            dec = decode_template(pre.manifest, pre.blobs, name)
            psnr_all = min(psnr_tokens(_edit(model, cfg, dec, kv_mode, user), ref_out), held_out[name])
            ratios, mses = [], []
            for s, layer in shards:
                reps = {r["name"]: r for r in by_slot[(s, layer)]["representations"]}
                rep = reps[name]
                chain = rep["bytes"] + sum(r["bytes"] for r in reps.values() if r["digest"] in rep.get("requires", []))
                ratios.append(fp16_shard / chain)
                p = psnr_tokens(_edit(model, cfg, _with_shard(exact, dec, s, layer), kv_mode, user), ref_out)
                mses.append(4 * 10 ** (-p / 10))
            total = 4 * 10 ** (-psnr_all / 10)
            scale = total / sum(mses) if sum(mses) > 0 else 0.0
            shares = [m * scale for m in mses] if sum(mses) > 0 else [total / len(shards)] * len(shards)
            progressive = any(r.get("requires") for r in reps0 if r["name"] == name)
            levels.append(
                {
                    "name": name,
                    "ratio": ratios,
                    "mse": shares,
                    "psnr_db": psnr_all,
                    "progressive": progressive,
                    "level": names.index(name),
                }
            )
            say(
                f"{kv_mode} {family}/{name}: ratio {np.mean(ratios):.2f}x (shards {min(ratios):.2f}-{max(ratios):.2f}), "
                f"PSNR {psnr_all:.1f} dB"
            )
        levels.sort(key=lambda lv: -float(np.mean(lv["ratio"])))  # cheapest first
        out["families"][family] = {"codec": codec, "levels": levels}
    out["kv_layer0"] = [_layer_kv(e, kv_mode) for e in exacts]
    return out


def manifest_psnr(manifest: dict) -> dict[str, float]:
    """Per level name, the lowest ``psnr_db`` a manifest's representations of it state (precompute's held-out edits,
    :mod:`sakura_core.precompute.output_psnr`)."""
    out: dict[str, float] = {}
    for shard in manifest["shards"]:
        for r in shard["representations"]:
            out[r["name"]] = min(out.get(r["name"], math.inf), float(r["psnr_db"]))
    return out


def _layer_kv(kv, kv_mode: str) -> list[np.ndarray]:
    """Per demo layer, (2, tokens, heads, head_dim) float32 of step 0 (per-step) or of the layer (single)."""
    t = kv.kv[0] if kv_mode == "per-step" else kv.kv  # (layers, 2, tokens, heads, head_dim)
    return [t[layer].float().numpy() for layer in range(t.shape[0])]


def synthesize_shard(kv: np.ndarray, tokens: int, heads: int, head_dim: int, rng: np.random.Generator) -> np.ndarray:
    """(2, T0, H0, D0) -> (2, tokens, heads, head_dim) float32 by mixing token pairs (the module docstring)."""
    out = np.empty((2, tokens, heads * head_dim), dtype=np.float32)
    c = heads * head_dim
    for kind in range(2):
        src = kv[kind].reshape(kv.shape[1], -1).astype(np.float32)  # (T0, C0)
        t0, c0 = src.shape
        mu = src.mean(axis=0)
        dev = src - mu
        for b in range(math.ceil(c / c0)):
            cols = np.arange(b * c0, min((b + 1) * c0, c))
            i, j = rng.integers(0, t0, tokens), rng.integers(0, t0, tokens)
            a = rng.uniform(0.0, math.pi / 2, tokens)[:, None]
            src_cols = cols % c0
            out[kind][:, cols] = mu[src_cols] + np.cos(a) * dev[i][:, src_cols] + np.sin(a) * dev[j][:, src_cols]
    return out.reshape(2, tokens, heads, head_dim)


def _encode(codec_name: str, kv: np.ndarray, layer: int, num_layers: int) -> tuple[list[int], list[list[bytes]]]:
    """Chain bytes per level and the chains of a (2, T, H, D) shard at model position ``layer``, no weights."""
    codec = get_codec(codec_name)
    t = kv.shape[1]
    rows = int(math.sqrt(t))
    while t % rows:
        rows -= 1
    meta = ShardMeta("0" * 64, "synthetic", "flux2-ref-t10", layer, (rows, t // rows), num_layers)
    inp = ShardInput(np.ascontiguousarray(kv[0][None]), np.ascontiguousarray(kv[1][None]), meta)
    levels = list(codec.levels)
    blobs = codec.encode(inp, levels)
    chains = [blobs[: i + 1] if codec.progressive else [blobs[i]] for i in range(len(levels))]
    return [sum(len(b) for b in ch) for ch in chains], chains


def size_effects(demo: dict, geometry: DitGeometry, cfg: LadderConfig, say: Callable[[str], None] = print) -> dict:
    """Part 2 of the module docstring: per family, per codec level, the size factor and the decode speed (fp16
    bytes per second) at ``geometry``'s shard size."""
    rng = np.random.default_rng(cfg.seed)
    L0 = demo["layers"]
    refs = geometry.references
    if len(demo["kv_layer0"]) < refs:
        raise ValueError(f"{geometry.name} has {refs} references; give LadderConfig.templates at least {refs}")
    per_ref = geometry.template_tokens // refs
    out: dict[str, dict[str, list[float]]] = {}  # family -> its factors, decode speeds and checks per level
    for family, fam in demo["families"].items():
        codec = fam["codec"]
        n_levels = len(get_codec(codec).levels)
        factors: list[list[float]] = [[] for _ in range(n_levels)]
        speeds: list[list[float]] = [[] for _ in range(n_levels)]
        # real demo layer's ratio / its synthesis's, at the demo's size
        check: list[list[float]] = [[] for _ in range(n_levels)]
        for dl in cfg.synth_layers:
            src = [demo["kv_layer0"][r][dl] for r in range(refs)]
            _, t0, h0, d0 = src[0].shape  # (2, tokens, heads, head_dim)
            small = synthesize_shard(src[0], t0, h0, d0, rng)
            big = np.concatenate(
                [synthesize_shard(x, per_ref, geometry.heads, geometry.head_dim, rng) for x in src], axis=1
            )
            gl = _geometry_layer(dl, L0, geometry)
            b_small, _ = _encode(codec, small, dl, L0)
            b_real, _ = _encode(codec, src[0], dl, L0)
            b_big, chains = _encode(codec, big, gl, geometry.layers)
            fp_small, fp_big = small.size * 2, big.size * 2
            for j in range(n_levels):
                factors[j].append((fp_big / b_big[j]) / (fp_small / b_small[j]))
                check[j].append(b_small[j] / b_real[j])
                dt = min(_cpu_time(lambda ch=chains[j]: decode_chain(ch)) for _ in range(cfg.repeats))
                speeds[j].append(fp_big / dt)
            del big, chains
        out[family] = {
            "factor": [float(np.exp(np.mean(np.log(f)))) for f in factors],
            "decode_bytes_per_s": [float(len(s) / sum(1 / x for x in s)) for s in speeds],
            "synthesis_check": [float(np.mean(c)) for c in check],
        }
        say(
            f"{geometry.name} {family}: size factor {', '.join(f'{x:.3f}' for x in out[family]['factor'])}; decode "
            f"{', '.join(f'{x / 1e6:.0f}' for x in out[family]['decode_bytes_per_s'])} MB/s (fp16 bytes per CPU second); "
            f"real / synthesised ratio at the demo's size {', '.join(f'{x:.3f}' for x in out[family]['synthesis_check'])}"
        )
    return out


def _cpu_time(fn) -> float:
    """CPU seconds of this thread running ``fn`` (the machine is shared: wall clock would count waiting for a core;
    the decoders run on the calling thread, zstd included)."""
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


def _geometry_layer(demo_layer: int, demo_layers: int, g: DitGeometry, demo_double: int = 2) -> int:
    """The geometry layer at the same relative depth as ``demo_layer`` (double and single blocks apart)."""
    if g.double_layers and demo_layer < demo_double:
        return min(g.double_layers - 1, demo_layer * g.double_layers // demo_double)
    if g.double_layers:
        rel = (demo_layer - demo_double) / max(demo_layers - demo_double, 1)
        return min(g.layers - 1, g.double_layers + int(rel * (g.layers - g.double_layers)))
    return min(g.layers - 1, demo_layer * g.layers // demo_layers)


def _demo_layer(layer: int, g: DitGeometry, demo_layers: int, demo_double: int = 2) -> int:
    """The demo layer a geometry layer takes its ratios and error share from (the inverse of the mapping above)."""
    if g.double_layers and layer < g.double_layers:
        return min(demo_double - 1, layer * demo_double // g.double_layers)
    if g.double_layers:
        rel = (layer - g.double_layers) / (g.layers - g.double_layers)
        return min(demo_layers - 1, demo_double + int(rel * (demo_layers - demo_double)))
    return min(demo_layers - 1, layer * demo_layers // g.layers)


def geometry_ladders(demo: dict, effects: dict, geometry: DitGeometry, kv_mode: str, source: dict) -> ShardLadders:
    """The :class:`ShardLadders` of ``geometry`` from the two measurements (the module docstring)."""
    L0, S0 = demo["layers"], demo["steps"]
    L, S = geometry.layers, (geometry.steps if kv_mode == "per-step" else 1)
    fp16 = geometry.shard_bytes_fp16
    slots = [(s, layer) for s in range(S) for layer in range(L)]
    demo_of = [min(S0 - 1, s * S0 // S) * L0 + _demo_layer(layer, geometry, L0) for s, layer in slots]
    users = np.bincount(demo_of, minlength=S0 * L0)
    fams = {}
    for family, fam in demo["families"].items():
        eff = effects[family]
        if family == "sakura":  # sakura's ladder ends with the exact level (the fp16 family's)
            extra = demo["families"]["fp16"]["levels"]
            levels = fam["levels"] + [dict(lv, level=None) for lv in extra]
        else:
            levels = fam["levels"]
        rows: dict[str, list[tuple]] = {"bytes": [], "increment_bytes": [], "decode_s": [], "mse": []}
        for d in demo_of:
            prev, b_row, i_row, t_row, m_row = 0, [], [], [], []
            for lv in levels:
                src = eff if lv["level"] is not None else effects["fp16"]
                j = lv["level"] if lv["level"] is not None else 0
                nbytes = max(1, round(fp16 / (lv["ratio"][d] * src["factor"][j])))
                prog = lv["progressive"] and lv["level"] is not None and nbytes > prev
                b_row.append(nbytes)
                i_row.append(nbytes - prev if prog else nbytes)
                t_row.append(fp16 / src["decode_bytes_per_s"][j])
                m_row.append(lv["mse"][d] / users[d])
                prev = nbytes
            for k, row in zip(rows, (b_row, i_row, t_row, m_row), strict=True):
                rows[k].append(tuple(row))
        prog = tuple(bool(lv["progressive"] and lv["level"] is not None) for lv in levels)
        psnr = [lv["psnr_db"] for lv in levels]
        ok = [j for j, p in enumerate(psnr) if p >= PSNR_FLOOR_DB]
        floor = ok[0] if ok else int(np.argmax(psnr))
        fams[family] = FamilyLadders(
            tuple(lv["name"] for lv in levels), prog, floor, **{k: tuple(v) for k, v in rows.items()}
        )
    return ShardLadders(geometry.name, kv_mode, L, geometry.steps, fams, source)
