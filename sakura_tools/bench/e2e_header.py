"""What every ``sakura bench e2e`` sim table rests on, stated (:func:`sim_header`), and sakura's ladders as the run's
store profile serves them (:func:`store_view`)."""

from __future__ import annotations

from sakura_core.kv.storage import DEFAULT_STORE_PROFILE
from sakura_core.runtime.profiles import CPU_SLOWDOWN_SOURCE

from .e2e_ladders import ladder_lines

__all__ = ["FP16_BASELINE_NOTE", "sim_header", "store_view"]


def sim_header(args, kv_mode, profile, lad, config) -> list[str]:
    """What every table below rests on, stated."""
    g = profile.model
    shards = f"{g.steps} steps x {g.layers} layers" if kv_mode == "per-step" else f"{g.layers} layers"
    starts = f"every trace x {args.starts} start offsets, evenly spaced over its length"
    lines = [
        "SIMULATION. Every median and worst case below is over "
        + starts
        + ("" if args.starts >= 3 else f" -- DEVELOPMENT RUN: --starts {args.starts} < 3, not a reported figure"),
        f"ladders: one per shard ({shards}); {kv_mode} KV measured on the demo model; bytes and decode speed at this "
        f"geometry's shard size ({g.template_tokens} tokens x {g.heads} x {g.head_dim}; demo layers synthesised by "
        f"token mixing, no repeats for zstd){' from ' + args.ladders if args.ladders else ''}",
        *ladder_lines(lad, g.shard_bytes_fp16, getattr(profile, "cpu_slowdown", 1.0)),
    ]
    if config.planning == "measured":
        plan = f"each decision's CPU time on this host x {profile.cpu_slowdown:g} (the phone's CPU vs this one)"
    elif config.planning == "fixed":
        plan = f"{config.planning_s * 1e3:g} ms per decision (fixed)"
    else:
        plan = "NOT charged (--planning off)"
    lines.append(f"planning charged: {plan}")
    lines.append(
        "requests: "
        + (
            "sent ahead (the next leaves once the bytes on their way are within two round "
            "trips of the link; one transfer on the wire at a time)"
            if config.request_ahead
            else "sequential (each after the transfer before, paying its round trip)"
        )
    )
    if kv_mode == "per-step":
        room = config.prefetch_kv_bytes
        lines.append(
            "prefetch: "
            + (
                "not limited (the decoded KV held is reported, not bounded)"
                if room is None
                else f"at most {room / 2**30:g} GiB of later steps' decoded KV held (the phone agent's prefetch room)"
            )
        )
    cores = profile.dit_cpu_cores
    share = f"decode and planning threads each take 1 of the DiT's {cores} cores while they work"
    lines.append(f"CPU sharing: {share if cores else f'none (the DiT runs on the {profile.soc})'}")
    if profile.name.endswith("-cpu") or profile.name.endswith("-gpu"):
        lines.append(f"the profile's CPU speed: {CPU_SLOWDOWN_SOURCE}")
    lines.append(
        "links: the trace itself for the trace-reading rules (cachegen, oracle); every other policy sees only "
        "what a client measures"
    )
    return lines


#: What the fetch-fp16 baseline reads when sakura's store is ``serving`` (which holds no fp16).
FP16_BASELINE_NOTE = (
    "fetch-fp16: the exact fp16 of a store of profile full (a serving store holds no fp16; the "
    "baseline is what the same template costs published with --store-profile full)"
)


def store_view(args, lad, ladders: dict, kv_mode: str, g, measured: str, data: dict | None = None):
    """(ladders with sakura's family as ``--store-profile`` serves it, the rungs held)."""
    from sakura_core.precompute.store_profile import StoreProfile

    from .per_step_ladders import load
    from .serving_ladders import held_per_step, held_single, serving_view

    profile = StoreProfile(getattr(args, "store_profile", DEFAULT_STORE_PROFILE))
    if kv_mode == "per-step" and measured == "measured":
        held = held_per_step(load() if data is None else data, profile)
    else:
        fam = lad.families["sakura"]
        held = held_single(list(fam.levels), fam.psnr_db(), any(fam.progressive), profile)
    view_mode = kv_mode if held.later is not None else "single"
    return {**ladders, "sakura": serving_view(ladders["sakura"], held, g.layers, view_mode)}, held
