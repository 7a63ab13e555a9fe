"""Per-step ladders at any step count (8, 28, 50 ...): measured where a measurement exists, else a ladder model fitted
from the measured ones, with its error on a held-out step count stated.

Measured: ``per_step_ladders.json`` (4 steps) and ``per_step_ladders_<S>.json`` beside this file, each made with
``sakura precompute --model demo --image astronaut --id astro-ps --kv-mode per-step --steps S --store-profile full``
and :func:`~sakura_tools.bench.per_step_ladders.from_manifest` (the shape that module's docstring gives).

The model (:func:`fit_model`, per level, S the step count, s a step, t = s / S its place in the schedule):

* edit PSNR (open loop, the closed-loop twins' track, the reuse rung): ``a + b ln S`` (least squares);
* step 0's ratios to fp16 (a chain from nothing and the level's own blob): their mean (step 0 is coded alone, at
  the same sigma whatever S);
* a later step's ratios (chain, own blob, twin): ``ln r = c0 + c1 ln S + c2 t`` (least squares over every measured
  later step): a residual against the step before shrinks as the steps get closer;
* ``ref_step``: the step before (as measured), none for fp16.

:func:`heldout_check` fits on every measured count but one (default the largest) and states the error on that one
(edit PSNR in dB, each level's bytes over the edit relative); ``sakura bench ladder-model [--hold-out S]`` writes the
model with that check to ``per_step_model.json`` (with ``--hold-out`` the model itself never saw S), which
:func:`per_step_data` reads for a count nobody measured. 28 and 50 steps lie beyond every measured count: the stated
error is that of a 2x extrapolation, not a bound at 3-6x beyond the largest measured count.

:func:`stretch_ladders` takes a geometry's per-step :class:`~sakura_core.runtime.sim_ladders.ShardLadders` (the other
families, measured at 4 steps) to S steps: step s uses the measured step at the same place in the schedule
(``floor(s * S0 / S)``), and that step's MSE share is split among the steps that use it (each level's edit PSNR kept).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from sakura_core.runtime.sim_ladders import FamilyLadders, ShardLadders

from .per_step_ladders import DATA_PATH, load

__all__ = [
    "MODEL_PATH",
    "fit_model",
    "heldout_check",
    "measured_data",
    "model_data",
    "per_step_data",
    "stretch_ladders",
    "write_model",
]

MODEL_PATH = Path(__file__).with_name("per_step_model.json")
MODEL_FORMAT = "sakura-per-step-ladder-model"


def measured_data(folder: Path | str = DATA_PATH.parent) -> dict[int, dict]:
    """Every measured per-step ladder file in ``folder``, by step count."""
    folder = Path(folder)
    out = {}
    for path in sorted(folder.glob("per_step_ladders*.json")):
        data = load(path)
        out[int(data["steps"])] = data
    return dict(sorted(out.items()))


def _line(xs, ys) -> list[float]:
    """(a, b) of y = a + b x, least squares (a constant when the xs are all equal)."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    if len(set(xs.tolist())) < 2:
        return [float(ys.mean()), 0.0]
    b, a = np.polyfit(xs, ys, 1)
    return [float(a), float(b)]


def _later(rows: list[tuple[int, list]]) -> list[float]:
    """(c0, c1, c2) of ln r = c0 + c1 ln S + c2 s / S over every step s >= 1 of every (S, ratios) in ``rows``."""
    a, y = [], []
    for steps, ratios in rows:
        for s in range(1, steps):
            a.append([1.0, math.log(steps), s / steps])
            y.append(math.log(ratios[s]))
    coef, *_ = np.linalg.lstsq(np.asarray(a), np.asarray(y), rcond=None)
    return [float(c) for c in coef]


def fit_model(measured: dict[int, dict]) -> dict:
    """The model above fitted on ``measured`` (step count -> per-step ladder data; at least two counts > 1)."""
    counts = sorted(measured)
    if len([c for c in counts if c > 1]) < 2:
        raise ValueError(
            f"the ladder model needs measurements at two step counts > 1, got {counts}: measure another "
            "(sakura precompute --kv-mode per-step --steps S --store-profile full)"
        )
    names = [lv["name"] for lv in measured[counts[0]]["levels"]]
    for c in counts:
        if [lv["name"] for lv in measured[c]["levels"]] != names:
            raise ValueError(f"the {c}-step measurement's levels differ from the {counts[0]}-step one's ({names})")
    logs = [math.log(c) for c in counts]
    levels = []
    for j, name in enumerate(names):
        lvs = [measured[c]["levels"][j] for c in counts]
        lv = {
            "name": name,
            "psnr_db": _line(logs, [x["psnr_db"] for x in lvs]),
            "step0": [
                float(np.mean([x["ratio_vs_fp16"][0] for x in lvs])),
                float(np.mean([x["increment_ratio"][0] for x in lvs])),
            ],
            "ratio_vs_fp16": _later([(c, x["ratio_vs_fp16"]) for c, x in zip(counts, lvs, strict=True)]),
            "increment_ratio": _later([(c, x["increment_ratio"]) for c, x in zip(counts, lvs, strict=True)]),
            "referenced": all(x["ref_step"][1:] == list(range(c - 1)) for c, x in zip(counts, lvs, strict=True)),
        }
        if all(x.get("closed") for x in lvs):
            lv["closed"] = {
                "psnr_db": _line(logs, [x["closed"]["psnr_db"] for x in lvs]),
                "ratio_vs_fp16": _later([(c, x["closed"]["ratio_vs_fp16"]) for c, x in zip(counts, lvs, strict=True)]),
            }
        levels.append(lv)
    reuse = [measured[c].get("reuse") for c in counts]
    return {
        "format": MODEL_FORMAT,
        "version": 1,
        "fit_on": counts,
        "coding": measured[counts[0]]["coding"],
        "levels": levels,
        "reuse": _line(logs, [r["psnr_db"] for r in reuse if r]) if all(reuse) else None,
    }


def _ratios(step0: float, coef: list[float], steps: int) -> list[float]:
    return [round(step0, 4)] + [
        round(math.exp(coef[0] + coef[1] * math.log(steps) + coef[2] * s / steps), 4) for s in range(1, steps)
    ]


def model_data(model: dict, steps: int) -> dict:
    """The per-step ladder data (:mod:`.per_step_ladders`' shape) the model gives for ``steps`` steps."""
    if steps < 2:
        raise ValueError(f"the ladder model is for per-step edits of >= 2 steps, got {steps}")
    ln = math.log(steps)
    levels = []
    for lv in model["levels"]:
        ratio = _ratios(lv["step0"][0], lv["ratio_vs_fp16"], steps)
        inc = _ratios(lv["step0"][1], lv["increment_ratio"], steps)
        out = {
            "name": lv["name"],
            "psnr_db": round(lv["psnr_db"][0] + lv["psnr_db"][1] * ln, 3),
            "ratio_vs_fp16": ratio,
            "increment_ratio": inc,
            "ref_step": [None] + (list(range(steps - 1)) if lv["referenced"] else [None] * (steps - 1)),
        }
        if lv.get("closed"):
            c = lv["closed"]
            out["closed"] = {
                "psnr_db": round(c["psnr_db"][0] + c["psnr_db"][1] * ln, 3),
                "ratio_vs_fp16": [None] + _ratios(1.0, c["ratio_vs_fp16"], steps)[1:],
            }
        levels.append(out)
    reuse = model.get("reuse")
    return {
        "steps": steps,
        "coding": model["coding"],
        "source": {
            "model": f"bench/step_ladders.py fitted on {model['fit_on']} steps (per_step_model.json)",
            "heldout": model.get("heldout"),
        },
        "levels": levels,
        "reuse": None
        if reuse is None
        else {"psnr_db": round(reuse[0] + reuse[1] * ln, 3), "ref_step": [None] + list(range(steps - 1))},
    }


def _edit_bytes(ratios: list) -> float:
    """A level's bytes over the edit, in fp16 shards (the sum of 1 / ratio over the steps that have one)."""
    return sum(1 / r for r in ratios if r)


def heldout_check(measured: dict[int, dict], heldout: int | None = None) -> dict:
    """Fit on every measured count but ``heldout`` (default: the largest) and compare with its measurement: per
    level the edit PSNR error (dB; the twins' too) and the edit's bytes' relative error, and their maxima."""
    heldout = max(measured) if heldout is None else heldout
    fit = fit_model({c: d for c, d in measured.items() if c != heldout})
    pred, meas = model_data(fit, heldout), measured[heldout]
    rows = []
    for p, m in zip(pred["levels"], meas["levels"], strict=True):
        row = {
            "name": m["name"],
            "psnr_error_db": round(p["psnr_db"] - m["psnr_db"], 3),
            "bytes_rel_error": round(_edit_bytes(p["ratio_vs_fp16"]) / _edit_bytes(m["ratio_vs_fp16"]) - 1, 4),
        }
        if m.get("closed") and p.get("closed"):
            row["closed_psnr_error_db"] = round(p["closed"]["psnr_db"] - m["closed"]["psnr_db"], 3)
            row["closed_bytes_rel_error"] = round(
                _edit_bytes(p["closed"]["ratio_vs_fp16"]) / _edit_bytes(m["closed"]["ratio_vs_fp16"]) - 1, 4
            )
        rows.append(row)
    psnr = [abs(v) for r in rows for k, v in r.items() if k.endswith("psnr_error_db")]
    nbytes = [abs(v) for r in rows for k, v in r.items() if k.endswith("bytes_rel_error")]
    return {
        "steps": heldout,
        "fit_on": fit["fit_on"],
        "max_psnr_error_db": max(psnr),
        "max_bytes_rel_error": max(nbytes),
        "levels": rows,
    }


def write_model(
    path: Path | str = MODEL_PATH, measured: dict[int, dict] | None = None, hold_out: int | None = None
) -> dict:
    """Write the model to ``path`` and return it: fitted on every measurement but ``hold_out`` with its error on that
    count stated (a count the model never saw), or, without ``hold_out``, fitted on every one with the error of the
    same fit less the largest count (:func:`heldout_check`)."""
    measured = measured_data() if measured is None else measured
    if hold_out is not None and hold_out not in measured:
        raise ValueError(f"--hold-out {hold_out}: no measurement at {hold_out} steps (measured: {sorted(measured)})")
    fit_on = {c: d for c, d in measured.items() if c != hold_out}
    command = "sakura bench ladder-model" + (f" --hold-out {hold_out}" if hold_out is not None else "")
    model = {"command": command, **fit_model(fit_on), "heldout": heldout_check(measured, hold_out)}
    Path(path).write_text(json.dumps(model, indent=1) + "\n")
    return model


def per_step_data(steps: int, model_path: Path | str = MODEL_PATH) -> dict:
    """The per-step ladder data for ``steps``: the measurement when one exists, else the model's."""
    measured = measured_data()
    if steps in measured:
        return measured[steps]
    path = Path(model_path)
    if not path.is_file():
        raise ValueError(
            f"no per-step ladders measured for {steps} steps (measured: {sorted(measured)}) and no "
            f"model at {path}: run `sakura bench ladder-model`"
        )
    model = json.loads(path.read_text())
    if model.get("format") != MODEL_FORMAT:
        raise ValueError(f"{path} is not a {MODEL_FORMAT} file; rewrite it with `sakura bench ladder-model`")
    return model_data(model, steps)


def _stretch_family(fam: FamilyLadders, layers: int, steps0: int, steps: int) -> FamilyLadders:
    src = [s * steps0 // steps for s in range(steps)]  # the measured step at the same place in the schedule
    uses = [src.count(m) for m in range(steps0)]
    rows: dict[str, list[tuple]] = {k: [] for k in ("bytes", "increment_bytes", "decode_s", "mse")}
    ref: list[tuple[int | None, ...]] = []  # with fam.reference: each shard's reference shards
    for s in range(steps):
        for layer in range(layers):
            g0 = src[s] * layers + layer
            for k in ("bytes", "increment_bytes", "decode_s"):
                rows[k].append(getattr(fam, k)[g0])
            rows["mse"].append(tuple(v / uses[src[s]] for v in fam.mse[g0]))
            if fam.reference is not None:
                ref.append(tuple(None if r is None else (s - 1) * layers + layer for r in fam.reference[g0]))
    return FamilyLadders(
        fam.levels,
        fam.progressive,
        fam.floor,
        reference=None if fam.reference is None else tuple(ref),
        **{k: tuple(v) for k, v in rows.items()},
    )


def stretch_ladders(lad: ShardLadders, steps: int) -> ShardLadders:
    """``lad`` (per-step, measured at ``lad.steps``) at ``steps`` steps (module docstring); ``lad`` itself when the
    counts agree."""
    if lad.kv_mode != "per-step" or steps == lad.steps:
        return lad
    fams = {n: _stretch_family(f, lad.layers, lad.steps, steps) for n, f in lad.families.items()}
    source = {
        **lad.source,
        "stretched": f"measured at {lad.steps} steps, stretched to {steps} (bench/step_ladders.py)",
    }
    return ShardLadders(lad.geometry, lad.kv_mode, lad.layers, steps, fams, source)
