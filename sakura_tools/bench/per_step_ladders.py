"""Per-step SAKURA ladders measured on per-step (cross-step) KV, for the simulator: the data and how it scales.

``per_step_ladders.json`` (beside this file) holds one measured per-step template (``sakura precompute --kv-mode
per-step --steps S`` on the trained demo model; its ``source`` says which) in this shape::

    {"steps": S, "coding": "cross-step" | "independent", "source": {...},
     "levels": [                                   # cheapest first, the fetchable levels (fp16 last)
       {"name": "sakura-l3",
        "psnr_db": end-to-end PSNR of the edit with every (step, layer) at this level,
        "ratio_vs_fp16": [r_0, ..., r_{S-1}],      # per step: fp16 bytes of a step / bytes of its level-j chain
        "increment_ratio": [...],                  # per step: fp16 bytes / bytes of this level's own blob
        "ref_step": [null, 0, 1, ...],             # per step: the step it is decoded against (null: none)
        "closed": {"psnr_db": ..., "ratio_vs_fp16": [null, r_1, ...]}}],  # its closed-loop twins (optional)
     "reuse": {"psnr_db": ..., "ref_step": [null, 0, 1, ...]}}   # the zero-byte rung of steps >= 1 (or null)

A shard of step s at level j costs ``shard_fp16 / ratio_vs_fp16[s][j]`` bytes from nothing; upgrading it from level
j-1 costs ``shard_fp16 / increment_ratio[s][j]``; when ``ref_step[s]`` is set, it decodes only once the same layer
of that step is decoded (or computed) on the device, so its chain costs that shard's decode first
(:func:`per_step_ladders` sets ``Level.ref_step``). The zero-byte ``reuse`` rung (step s-1's KV of the layer as it
is) joins the ladders of steps >= 1 as their first level when its PSNR reaches the floor a caller names
(``reuse_floor_db``); a level's closed-loop twins (``closed``: steps >= 1, fetched instead of the level when the
layer stays on the level's track, PSNR measured with step 0 at the level and every later step its twin) become
``Level.closed``; the floor is then chosen on the track's PSNR (:func:`track_psnr_db`). With the reuse rung in,
those shards' floor is that rung (:func:`reuse_floors`). :func:`from_manifest` makes the
data from a per-step manifest.
"""

from __future__ import annotations

import json
from pathlib import Path

from sakura_core.kv.names import closed_name
from sakura_core.policy.ladder import CrossStepLinks, Level

__all__ = [
    "DATA_PATH",
    "from_manifest",
    "load",
    "per_step_ladders",
    "reuse_eligible",
    "reuse_floors",
    "track_psnr_db",
]

DATA_PATH = Path(__file__).with_name("per_step_ladders.json")


def from_manifest(manifest: dict, source: dict | None = None) -> dict:
    """The JSON shape above from a per-step manifest (one layer per shard; ratios averaged over the layers)."""
    sched = manifest["schedule"]
    steps = sched["steps"]
    rows, cols = manifest["token_grid"]
    fp16 = 2 * rows * cols * manifest["heads"] * manifest["head_dim"] * 2  # one layer's K + V in fp16
    by: dict[str, dict[int, list[dict]]] = {}  # level name -> step -> its representations
    for sh in manifest["shards"]:
        for r in sh["representations"]:
            by.setdefault(r["name"], {}).setdefault(sh["step"], []).append(r)
    names = sorted(
        (n for n in by if n != "reuse" and 0 in by[n]),
        key=lambda n: (n == "fp16", sum(r["total_bytes"] for r in by[n][0])),
    )
    levels = []
    for n in names:
        per = [by[n][s] for s in range(steps)]
        levels.append(
            {
                "name": n,
                "psnr_db": per[0][0].get("psnr_db"),
                "ratio_vs_fp16": [round(len(p) * fp16 / sum(r["total_bytes"] for r in p), 4) for p in per],
                "increment_ratio": [round(len(p) * fp16 / sum(r["bytes"] for r in p), 4) for p in per],
                "ref_step": [(p[0].get("ref") or {}).get("step") for p in per],
            }
        )
        twin = by.get(closed_name(n))
        if twin:  # steps >= 1 only (step 0 roots the track)
            levels[-1]["closed"] = {
                "psnr_db": twin[1][0].get("psnr_db"),
                "ratio_vs_fp16": [None]
                + [round(len(twin[s]) * fp16 / sum(r["bytes"] for r in twin[s]), 4) for s in range(1, steps)],
            }
    reuse = by.get("reuse")
    return {
        "steps": steps,
        "coding": manifest.get("per_step_coding", "independent"),
        "source": source or {},
        "levels": levels,
        "reuse": None
        if reuse is None
        else {
            "psnr_db": next(iter(reuse.values()))[0].get("psnr_db"),
            "ref_step": [None] + [reuse[s][0]["ref"]["step"] for s in range(1, steps)],
        },
    }


def _twin(lv: dict, s: int, shard_fp16_bytes: int, decode_s: float, n: int) -> Level | None:
    """The closed-loop twin of level ``lv`` at step ``s`` (None at step 0, or without one): its bytes, the level's
    decode time, an MSE share from the twin track's PSNR (step 0 at the level, every later step its twin)."""
    twin = lv.get("closed")
    if not twin or s == 0 or twin.get("psnr_db") is None:
        return None
    nbytes = int(round(shard_fp16_bytes / twin["ratio_vs_fp16"][s]))
    return Level(
        closed_name(lv["name"]),
        nbytes,
        nbytes,
        decode_s,
        4 * 10 ** (-twin["psnr_db"] / 10) / n,
        links=CrossStepLinks(ref_step=lv["ref_step"][s]),
    )


def track_psnr_db(lv: dict) -> float:
    """A level's PSNR on its track: its closed-loop twins' when it has them (a layer kept at the level), else its
    own (the open loop)."""
    twin = lv.get("closed")
    return twin["psnr_db"] if twin and twin.get("psnr_db") is not None else lv["psnr_db"]


def load(path: Path | str = DATA_PATH) -> dict:
    """The shipped measurement (or another file of the same shape)."""
    return json.loads(Path(path).read_text())


def reuse_eligible(data: dict, reuse_floor_db: float | None) -> bool:
    """The measurement has a ``reuse`` rung whose PSNR (every shard of steps >= 1 at it) reaches ``reuse_floor_db``."""
    reuse = data.get("reuse")
    return bool(
        reuse_floor_db is not None
        and reuse
        and reuse.get("psnr_db") is not None
        and reuse["psnr_db"] >= reuse_floor_db
        and data["steps"] > 1
    )


def reuse_floors(data: dict, layers: int, floor: int) -> list[int]:
    """Per shard the floor index in :func:`per_step_ladders`' ladders with the reuse rung in: ``floor`` at step 0,
    the rung (index 0) at every later step."""
    return [floor] * layers + [0] * ((data["steps"] - 1) * layers)


def per_step_ladders(
    data: dict, shard_fp16_bytes: int, layers: int, decode_bytes_per_s: dict, reuse_floor_db: float | None = None
) -> list[list[Level]]:
    """Ladders of the ``steps x layers`` shards (index ``s * layers + l``) of a geometry whose one-layer shard is
    ``shard_fp16_bytes`` in fp16. ``decode_bytes_per_s``: level name -> fp16 bytes decoded per second (phone-scale
    measurement). Output MSE per shard: ``4 * 10 ** (-psnr / 10) / (steps * layers)``, as the single-mode ladders;
    the reuse rung's (when :func:`reuse_eligible` at ``reuse_floor_db``: first in the ladders of steps >= 1, 0 bytes,
    no decode) ``4 * 10 ** (-psnr / 10) / ((steps - 1) * layers)``: its PSNR is measured with step 0 exact."""
    steps = data["steps"]
    n = steps * layers
    reuse = data["reuse"] if reuse_eligible(data, reuse_floor_db) else None
    out = []
    for s in range(steps):
        ladder, prev = [], 0
        if reuse is not None and s > 0:
            mse = 4 * 10 ** (-reuse["psnr_db"] / 10) / ((steps - 1) * layers)
            ladder.append(
                Level("reuse", 0, 0, 0.0, mse, links=CrossStepLinks(ref_step=reuse["ref_step"][s], reuse=True))
            )
        for lv in data["levels"]:
            nbytes = int(round(shard_fp16_bytes / lv["ratio_vs_fp16"][s]))
            inc = int(round(shard_fp16_bytes / lv["increment_ratio"][s]))
            prog = lv["name"] != "fp16" and nbytes > prev and inc < nbytes
            decode_s = shard_fp16_bytes / decode_bytes_per_s[lv["name"]]
            ladder.append(
                Level(
                    name=lv["name"],
                    nbytes=nbytes,
                    increment_bytes=inc if prog else nbytes,
                    decode_s=decode_s,
                    mse=4 * 10 ** (-lv["psnr_db"] / 10) / n,
                    progressive=prog,
                    links=CrossStepLinks(
                        ref_step=lv["ref_step"][s], closed=_twin(lv, s, shard_fp16_bytes, decode_s, n)
                    ),
                )
            )
            prev = nbytes
        out += [ladder] * layers
    return out
