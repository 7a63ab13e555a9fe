"""Codec benchmark: every codec and ladder level on the demo model's templates.

Per (codec, level), averaged over the templates:

* ``bytes``: what fetching that level from nothing costs for one template (all shards; for a progressive codec the
  base plus every enhancement up to the level), ``ratio_vs_fp16`` = fp16 KV bytes / ``bytes``;
* ``attn_rel_err``: relative error of the request attention output with the decoded KV, on held-out probe requests
  (not the probes the importance was fitted on);
* ``psnr_db``: end-to-end — the edit (``run_edit``, same user image, prompt, seed) with the decoded KV against the
  edit with the exact KV, on the output in [0, 1]; ``None`` where identical;
* ``encode_mb_s`` / ``decode_mb_s``: fp16 KV megabytes (1e6 bytes) per second through the encoder / decoder of the
  whole template, one thread, best of ``repeats``.

A second table measures decode throughput on one phone-scale shard (synthetic Gaussian K/V of a 1024-token, 24-head,
head_dim-128 layer), where per-call overhead no longer dominates as it does on the demo's 128 KiB shards.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from sakura_core.kv import decode_kv, encode_kv, get_codec
from sakura_core.kv.codec_registry import ShardInput, ShardMeta
from sakura_core.metrics import psnr_tokens
from sakura_core.models.edit_model import EditModel, load_demo_model, load_image
from sakura_core.models.kv_types import TemplateKV
from sakura_core.precompute import ProbeConfig, attention_error, capture_attention, estimate_importance
from sakura_core.precompute.probes import make_probes
from sakura_core.runtime.denoise import run_edit

from .timing import best_time_s

__all__ = ["DEFAULT_PROMPT", "CodecBenchConfig", "format_table", "run_codec_bench"]

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = "place it in the marked region"


@dataclass(frozen=True)
class CodecBenchConfig:
    """What the codec benchmark runs.

    Attributes:
        templates: demo template sample names (or image paths); marked with the demo edit region when the demo
            task module is available.
        users: user images (sample names or paths) edited against each template: the first ``max_users`` that are
            not the template itself.
        prompt: edit prompt.
        steps: denoising steps per edit.
        codecs: codec names, each run at every level of its ladder.
        shard_layers: layers per shard.
        probes: probe requests importance is fitted on; ``held_out_probes``: probes the attention error is measured on.
        seed: probe and edit seed.
        repeats: timing repetitions (best is reported).
        phone_scale: also measure decode throughput on a phone-scale shard.
        uniform_ablation: also run SAKURA with uniform token importance (rows ``sakura-uniform``), so the benefit
            of the learned importance is measured at equal bytes.
    """

    templates: tuple[str, ...] = ("astronaut", "coffee", "chelsea", "rocket")
    users: tuple[str, ...] = ("chelsea", "rocket", "coffee", "astronaut")
    max_users: int = 3
    prompt: str = DEFAULT_PROMPT
    steps: int = 8
    codecs: tuple[str, ...] = ("fp16", "int8", "int4", "cachegen", "sakura")
    shard_layers: int = 1
    probes: int = 8
    held_out_probes: int = 8
    seed: int = 0
    repeats: int = 5
    phone_scale: bool = True
    uniform_ablation: bool = True

    def __post_init__(self) -> None:
        if not self.templates:
            raise ValueError("templates must not be empty")
        if self.steps < 1 or self.repeats < 1 or self.probes < 1 or self.held_out_probes < 1 or self.max_users < 1:
            raise ValueError(
                f"steps, repeats, probes and held_out_probes must be >= 1, got {self.steps}, {self.repeats}, "
                f"{self.probes}, {self.held_out_probes}"
            )
        for name in self.codecs:
            get_codec(name)  # raises with the list of known codecs


def _template_image(name: str, size: int) -> np.ndarray:
    try:
        from sakura_core.demo.edit_task import demo_template
    except ImportError:
        logger.info("demo task module not available: templates are used unmarked")
        return load_image(name, size)
    from sakura_core.demo.edit_task import EditTaskConfig

    return demo_template(name, EditTaskConfig(image_size=size))


UNIFORM = "sakura-uniform"  # the ablation: the SAKURA codec without learned token importance


def _label(name: str, level: int) -> str:
    if name == UNIFORM:
        return f"{get_codec('sakura').level_name(level)} (uniform importance)"
    return get_codec(name).level_name(level)


def _levels(name: str) -> tuple[int, ...]:
    return get_codec(name).levels


def run_codec_bench(
    config: CodecBenchConfig | None = None,
    model: EditModel | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the benchmark; returns the JSON-able result (see :func:`format_table`)."""
    config = config or CodecBenchConfig()
    say = progress or (lambda msg: logger.info("%s", msg))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = model or load_demo_model()
        return _run(config, model, say)
    finally:
        torch.set_num_threads(threads)


def _run(config: CodecBenchConfig, model: EditModel, say: Callable[[str], None]) -> dict:
    size = model.spec.image_size
    per_codec: dict[tuple[str, int], list[dict]] = {}
    templates_out = []
    for tname in config.templates:
        image = _template_image(tname, size)
        t0 = time.perf_counter()
        kv = model.adapter.extract_template_kv(model.template_tokens(image), model.spec.grid)
        packed = model.pack_image(image)
        fit_cfg = ProbeConfig(num_probes=config.probes, seed=config.seed)
        importance = estimate_importance(model, kv, image, fit_cfg)  # what precompute_template does
        importance_s = time.perf_counter() - t0
        held_cfg = ProbeConfig(num_probes=config.held_out_probes, seed=config.seed)
        held = capture_attention(model, kv, make_probes(model, packed, held_cfg, stream=1))
        users = ([u for u in config.users if u != tname] or list(config.users))[: config.max_users]
        user_images = [load_image(u, size) for u in users]
        exact = [
            run_edit(model, u, config.prompt, steps=config.steps, seed=config.seed + i, kv_source=kv).tokens
            for i, u in enumerate(user_images)
        ]
        fp16_bytes = kv.num_layers * 2 * kv.num_tokens * kv.num_heads * kv.head_dim * 2
        templates_out.append(
            {
                "name": tname,
                "users": users,
                "kv_shape": list(kv.kv.shape),
                "fp16_bytes": fp16_bytes,
                "importance_s": round(importance_s, 4),
                "template_share": [round(float(x), 4) for x in importance.template_share],
                "mass_cv": [round(float(x), 4) for x in (importance.mass.std(-1) / importance.mass.mean(-1)).mean(-1)],
            }
        )
        for name in config.codecs:
            for level in _levels(name):
                say(f"template {tname}: {name} level {level}")
                row = _measure(name, level, kv, importance, held, model, user_images, exact, config, fp16_bytes)
                per_codec.setdefault((name, level), []).append(row)
        if "sakura" in config.codecs and config.uniform_ablation:
            for level in _levels("sakura"):
                say(f"template {tname}: sakura level {level}, uniform importance (ablation)")
                row = _measure("sakura", level, kv, None, held, model, user_images, exact, config, fp16_bytes)
                per_codec.setdefault((UNIFORM, level), []).append(row)

    rows = _average_rows(per_codec)
    result = {
        "model": {
            "name": model.spec.name,
            "id": model.model_id,
            "weights": model.weights_source,
            "random_weights": not model.weights_source.startswith("trained"),
            "layers": model.adapter.num_layers,
            "heads": model.adapter.num_heads,
            "head_dim": model.adapter.head_dim,
        },
        "config": {
            "templates": list(config.templates),
            "prompt": config.prompt,
            "steps": config.steps,
            "shard_layers": config.shard_layers,
            "probes": config.probes,
            "held_out_probes": config.held_out_probes,
            "seed": config.seed,
            "repeats": config.repeats,
            "threads": 1,
        },
        "templates": templates_out,
        "codecs": rows,
        "summary": _summary(rows),
    }
    if config.phone_scale:
        say("phone-scale decode throughput")
        result["phone_scale"] = _phone_scale(config)
    return result


def _average_rows(per_codec: dict[tuple[str, int], list[dict]]) -> list[dict]:
    """One row per (codec, level): the measurements averaged over the templates."""
    rows = []
    for (name, level), results in per_codec.items():
        psnrs = [r["psnr_db"] for r in results]
        rows.append(
            {
                "name": name,
                "level": level,
                "label": _label(name, level),
                "bytes": int(round(float(np.mean([r["bytes"] for r in results])))),
                "ratio_vs_fp16": round(float(np.mean([r["ratio_vs_fp16"] for r in results])), 3),
                "attn_rel_err": round(float(np.mean([r["attn_rel_err"] for r in results])), 6),
                "psnr_db": None if any(math.isinf(p) for p in psnrs) else round(float(np.mean(psnrs)), 3),
                "encode_mb_s": round(float(np.mean([r["encode_mb_s"] for r in results])), 2),
                "decode_mb_s": round(float(np.mean([r["decode_mb_s"] for r in results])), 2),
            }
        )
    return rows


def _measure(name, level, kv, importance, held, model, user_images, exact, config, fp16_bytes) -> dict:
    chains = encode_kv(name, kv, importance, level, shard_layers=config.shard_layers, template_id="bench")
    total = sum(len(b) for chain in chains for b in chain)
    encode_s = best_time_s(
        lambda: encode_kv(name, kv, importance, level, shard_layers=config.shard_layers, template_id="bench"),
        max(1, config.repeats // 2),
    )
    decoded = decode_kv(chains)
    decode_s = best_time_s(lambda: decode_kv(chains), config.repeats)
    kv_hat = TemplateKV(decoded.float(), kv.model_id, kv.token_grid, kv.rope_layout)
    err = attention_error(held, kv, {i: (kv_hat.kv[i, 0], kv_hat.kv[i, 1]) for i in range(kv.num_layers)})
    psnrs = []
    for i, (user, ref) in enumerate(zip(user_images, exact, strict=True)):
        out = run_edit(model, user, config.prompt, steps=config.steps, seed=config.seed + i, kv_source=kv_hat)
        psnrs.append(psnr_tokens(out.tokens, ref, cap_db=math.inf))  # inf: identical output
    return {
        "bytes": total,
        "ratio_vs_fp16": fp16_bytes / total,
        "attn_rel_err": err,
        "psnr_db": float(np.mean(psnrs)),
        "encode_mb_s": fp16_bytes / encode_s / 1e6,
        "decode_mb_s": fp16_bytes / decode_s / 1e6,
    }


def _interp_psnr(curve: list[tuple[int, float]], nbytes: int) -> float | None:
    """PSNR of a codec's ladder at ``nbytes`` by linear interpolation in log(bytes); ``None`` outside its range."""
    pts = sorted((b, p) for b, p in curve if p is not None)
    for (b0, p0), (b1, p1) in zip(pts, pts[1:], strict=False):
        if b0 <= nbytes <= b1:
            if b1 == b0:
                return max(p0, p1)
            f = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return p0 + f * (p1 - p0)
    return None


def _summary(rows: list[dict]) -> dict:
    sakura = [r for r in rows if r["name"] == "sakura"]
    cachegen = [r for r in rows if r["name"] == "cachegen"]
    out: dict = {}
    ok = [r for r in sakura if r["psnr_db"] is None or r["psnr_db"] >= 35.0]
    out["sakura_best_ratio_at_psnr_35db"] = max((r["ratio_vs_fp16"] for r in ok), default=None)
    curve = [(r["bytes"], r["psnr_db"]) for r in sakura]
    out["sakura_vs_cachegen_equal_size"] = [
        {
            "cachegen_level": r["level"],
            "bytes": r["bytes"],
            "cachegen_psnr_db": r["psnr_db"],
            "sakura_psnr_db": None if (p := _interp_psnr(curve, r["bytes"])) is None else round(p, 3),
        }
        for r in cachegen
    ]
    out["sakura_decode_mb_s_min"] = min((r["decode_mb_s"] for r in sakura), default=None)
    out["sakura_uniform_vs_learned_equal_size"] = [
        {
            "level": r["level"],
            "bytes": r["bytes"],
            "uniform_psnr_db": r["psnr_db"],
            "learned_psnr_db": None if (p := _interp_psnr(curve, r["bytes"])) is None else round(p, 3),
        }
        for r in rows
        if r["name"] == UNIFORM
    ]
    return out


def _phone_scale(config: CodecBenchConfig, tokens: int = 1024, heads: int = 24, head_dim: int = 128) -> dict:
    """Encode/decode throughput on one synthetic phone-scale layer (uniform importance; speed only)."""
    from sakura_core.kv.chain import decode_chain

    rng = np.random.default_rng(config.seed)
    shape = (1, tokens, heads, head_dim)
    k = rng.standard_normal(shape, dtype=np.float32)
    v = (0.6 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    meta = ShardMeta("0" * 64, "bench", "flux2-ref-t10", 0, (tokens // 32, 32), 24)
    shard = ShardInput(k, v, meta)
    fp16_bytes = 2 * k.size * 2
    rows = []
    for name in config.codecs:
        codec = get_codec(name)
        if name == "cachegen":
            levels = codec.levels[:1]  # one level is enough to show its (per-stream) decode speed
        else:
            levels = codec.levels
        for level in levels:
            blobs = codec.encode(shard, [lv for lv in codec.levels if lv <= level] if codec.progressive else [level])
            repeats = 1 if name == "cachegen" else max(2, config.repeats // 2)
            decode_s = best_time_s(partial(decode_chain, blobs), repeats)
            rows.append(
                {
                    "name": name,
                    "level": level,
                    "bytes": sum(len(b) for b in blobs),
                    "ratio_vs_fp16": round(fp16_bytes / sum(len(b) for b in blobs), 3),
                    "decode_mb_s": round(fp16_bytes / decode_s / 1e6, 2),
                }
            )
    return {"shape": [1, 2, tokens, heads, head_dim], "fp16_bytes": fp16_bytes, "data": "synthetic", "codecs": rows}


def _fmt(x, spec: str, none: str = "-") -> str:
    if x is None:
        return none
    return format(x, spec)


def format_table(result: dict) -> str:
    """The result as text tables (what ``sakura bench codec`` prints)."""
    m = result["model"]
    lines = [
        f"model {m['name']} ({m['weights']}{', RANDOM weights: PSNR/error say little about a trained model' if m['random_weights'] else ''}), "
        f"{m['layers']} layers x {m['heads']} heads x {m['head_dim']}; templates {', '.join(result['config']['templates'])}; "
        f"{result['config']['steps']} steps; 1 thread",
        "",
        f"{'codec':<12}{'level':>6}{'bytes':>10}{'x fp16':>8}{'attn err':>10}{'PSNR dB':>9}{'enc MB/s':>10}{'dec MB/s':>10}",
    ]
    for r in result["codecs"]:
        lines.append(
            f"{r['name']:<12}{r['level']:>6}{r['bytes']:>10}{r['ratio_vs_fp16']:>8.2f}{r['attn_rel_err']:>10.4f}"
            f"{_fmt(r['psnr_db'], '.2f', 'inf'):>9}{r['encode_mb_s']:>10.1f}{r['decode_mb_s']:>10.1f}"
        )
    s = result["summary"]
    lines.append("")
    lines.append(f"SAKURA best ratio with PSNR >= 35 dB: {_fmt(s['sakura_best_ratio_at_psnr_35db'], '.2f')}x")
    for c in s["sakura_vs_cachegen_equal_size"]:
        lines.append(
            f"at CacheGen level {c['cachegen_level']}'s size ({c['bytes']} B): CacheGen "
            f"{_fmt(c['cachegen_psnr_db'], '.2f')} dB, SAKURA {_fmt(c['sakura_psnr_db'], '.2f', 'n/a (outside ladder)')} dB"
        )
    lines.append(f"SAKURA slowest decode on demo shards: {_fmt(s['sakura_decode_mb_s_min'], '.1f')} MB/s")
    for c in s.get("sakura_uniform_vs_learned_equal_size", []):
        lines.append(
            f"ablation at sakura-uniform level {c['level']}'s size ({c['bytes']} B): uniform importance "
            f"{_fmt(c['uniform_psnr_db'], '.2f', 'inf')} dB, learned {_fmt(c['learned_psnr_db'], '.2f', 'n/a')} dB"
        )
    if "phone_scale" in result:
        p = result["phone_scale"]
        lines += ["", f"decode throughput, one phone-scale layer {tuple(p['shape'])} (synthetic data, 1 thread):"]
        lines.append(f"{'codec':<12}{'level':>6}{'bytes':>11}{'x fp16':>8}{'dec MB/s':>10}")
        for r in p["codecs"]:
            lines.append(
                f"{r['name']:<12}{r['level']:>6}{r['bytes']:>11}{r['ratio_vs_fp16']:>8.2f}{r['decode_mb_s']:>10.1f}"
            )
    return "\n".join(lines)
