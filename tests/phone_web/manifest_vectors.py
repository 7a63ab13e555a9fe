"""Manifest conformance vectors for the phone page's parser (``phone_web/src/manifest.js``): three valid manifests (a
single-mode ladder with a template image, a cross-step per-step template with reuse, residual and closed-loop
twins, a two-reference template) and every field of each mutated (deleted, null, another type, a float for an int,
out of range), plus the bounds of ``sakura_core.limits`` and JSON-level faults, each with what
``sakura_core.kv.manifest.parse_manifest`` (after ``limits.bounded_json``) makes of it: accepted, or its error class.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

from sakura_core.kv.manifest import parse_manifest
from sakura_core.limits import bounded_json

from ..manifest_fuzz import _paths  # every path into a JSON value, parents first

__all__ = ["manifest_cases", "write_manifest_vectors"]

MODEL = "ab12" * 16


def _digest(*parts) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _rep(level, name, nbytes, parent=None, codec="sakura", ref=None, key=None, **extra) -> dict:
    """A representation; ``parent``: the one it refines (its chain is the parent's plus the parent)."""
    requires = [] if parent is None else [*parent["requires"], parent["digest"]]
    out = {
        "level": level,
        "name": name,
        "codec": codec,
        "bytes": nbytes,
        "distortion": 0.1 / (1 + level),
        "digest": _digest(name, level, nbytes, key, ref, *requires),
        "requires": requires,
        **extra,
        "total_bytes": nbytes + (0 if parent is None else parent["total_bytes"]),
    }
    return out if ref is None else {**out, "ref": ref}


def _ladder(key) -> list[dict]:
    l0 = _rep(0, "sakura-l0", 1000, psnr_db=31.5, key=key)
    l1 = _rep(1, "sakura-l1", 900, l0, psnr_db=38.0, key=key)
    return [l0, l1, _rep(2, "fp16", 6000, codec="fp16", key=key)]


def _single() -> dict:
    return {
        "version": 2,
        "model_id": MODEL,
        "template_id": "conformance",
        "token_grid": [4, 6],
        "rope_layout": "flux2-ref-t10",
        "num_layers": 2,
        "heads": 2,
        "head_dim": 16,
        "codec": "sakura",
        "kv_mode": "single",
        "store_profile": "full",
        "template_image": {"digest": _digest("png"), "bytes": 5000, "format": "png"},
        "shards": [{"layers": [i, i], "representations": _ladder(i)} for i in range(2)],
    }


def _per_step() -> dict:
    m = _single()
    del m["template_image"]
    shards = [{"step": 0, "layers": [i, i], "representations": _ladder(i)} for i in range(2)]
    for i in range(2):
        prev = {r["name"]: r["digest"] for r in shards[i]["representations"]}
        ref = {"step": 0, "digest": prev["fp16"]}
        r0 = _rep(1, "sakura-l0", 300, ref={"mode": "residual", **ref}, key=(1, i))
        reps = [
            {
                "level": 0,
                "name": "reuse",
                "codec": "reuse",
                "bytes": 0,
                "distortion": 0.2,
                "digest": None,
                "requires": [],
                "ref": {"mode": "reuse", **ref},
            },
            r0,
            _rep(2, "sakura-l1", 200, r0, ref={"mode": "residual", **ref}, key=(1, i)),
            _rep(3, "fp16", 6000, codec="fp16", key=(1, i)),
        ]
        reps += [
            _rep(4 + j, f"{n}+cl", 250, ref={"mode": "closed", "step": 0, "digest": prev[n]}, key=(1, i))
            for j, n in enumerate(("sakura-l0", "sakura-l1"))
        ]
        shards.append({"step": 1, "layers": [i, i], "representations": reps})
    schedule = {"steps": 2, "timesteps": [1.0, 0.5], "shift": 3.0, "guidance": None, "sampler": "flow-euler"}
    return {**m, "kv_mode": "per-step", "schedule": schedule, "shards": shards}


def _two_refs() -> dict:
    m = _single()
    m.update(token_grid=[8, 6], rope_layout="flux2-ref-t10-x2")
    img = [{"digest": _digest("png", i), "bytes": 4000 + i, "format": "png"} for i in range(2)]
    m["template_image"] = img[0]
    m["references"] = [
        {
            "name": f"ref {i}",
            "size": [64, 64],
            "token_grid": [4, 6],
            "rope_t": 10 * (i + 1),
            "token_offset": 24 * i,
            "tokens": 24,
            "image": img[i],
        }
        for i in range(2)
    ]
    return m


_REPLACEMENTS = (None, "x", "", 2.5, -1, 0, True, [], {}, 10**12, 1e400)


def _mutations(base: dict):
    """(label, manifest) for every field: deleted, each replacement, an int as a float, an int + 1."""
    for path in _paths(base):
        if not path:
            continue
        parent = base
        for p in path[:-1]:
            parent = parent[p]
        old = parent[path[-1]]
        label = "/".join(map(str, path))
        variants = [("=" + json.dumps(r), r) for r in _REPLACEMENTS]
        if isinstance(old, int) and not isinstance(old, bool):
            variants += [("=float", float(old)), ("=+1", old + 1)]
        if isinstance(parent, dict):
            variants.append(("deleted", KeyError))
        for how, new in variants:
            m = copy.deepcopy(base)
            target = m
            for p in path[:-1]:
                target = target[p]
            if new is KeyError:
                del target[path[-1]]
            else:
                target[path[-1]] = new
            yield f"{label} {how}", m


def _limit_cases() -> list[tuple[str, dict]]:
    s, p = _single(), _per_step()
    out = []
    for label, field, value in (
        ("grid-rows-257", "token_grid", [257, 1]),
        ("grid-cols-257", "token_grid", [1, 257]),
        ("layers-513", "num_layers", 513),
        ("heads-257", "heads", 257),
        ("head-dim-1025", "head_dim", 1025),
        ("codec-empty", "codec", ""),
    ):
        out.append((f"limit/{label}", {**s, field: value}))
    out.append(("limit/elements-2^29", {**s, "token_grid": [256, 256], "heads": 8, "head_dim": 1024}))
    out.append(("limit/elements-2^28", {**s, "token_grid": [256, 256], "heads": 4, "head_dim": 1024}))
    times = [1 - i / 1001 for i in range(1001)]
    out.append(("limit/steps-1001", {**p, "schedule": {**p["schedule"], "steps": 1001, "timesteps": times}}))
    big = copy.deepcopy(s)
    big["shards"][0]["representations"][2]["bytes"] = (1 << 30) + 1
    big["shards"][0]["representations"][2]["total_bytes"] = (1 << 30) + 1
    out.append(("limit/blob-over-1gib", big))
    many = copy.deepcopy(s)
    for sh in many["shards"]:
        sh["representations"] = [_rep(j, f"sakura-l{j}", 10, key=(sh["layers"][0], j)) for j in range(65)]
    out.append(("limit/65-representations", many))
    out.append(("limit/image-over-64mib", {**s, "template_image": {"digest": _digest(), "bytes": (64 << 20) + 1}}))
    out.append(("limit/refs-x5", {**_two_refs(), "rope_layout": "flux2-ref-t10-x5", "token_grid": [10, 6]}))
    serving = copy.deepcopy(s)
    serving["store_profile"] = "serving"
    del serving["shards"][1]["representations"][2]
    out.append(("serving/subset-ladder", serving))
    out.append(("full/subset-ladder", {**serving, "store_profile": "full"}))
    return out


def manifest_cases() -> list[dict]:
    """Every case: ``name``, ``text`` (the JSON), ``options`` (``templateId``, ``modelId``, ``maxBytes``)."""
    cases = []
    for base_name, base in (("single", _single()), ("per-step", _per_step()), ("two-refs", _two_refs())):
        cases.append({"name": f"{base_name}/valid", "text": json.dumps(base)})
        cases.append({"name": f"{base_name}/other-model", "text": json.dumps(base), "options": {"modelId": "cd" * 32}})
        cases.append(
            {"name": f"{base_name}/other-template", "text": json.dumps(base), "options": {"templateId": "other"}}
        )
        cases.append(
            {
                "name": f"{base_name}/asked-for",
                "text": json.dumps(base),
                "options": {"templateId": "conformance", "modelId": MODEL},
            }
        )
        cases += [{"name": f"{base_name}/{label}", "text": json.dumps(m)} for label, m in _mutations(base)]
    cases += [{"name": name, "text": json.dumps(m)} for name, m in _limit_cases()]
    valid = json.dumps(_single())
    cases += [
        {"name": "json/nan", "text": valid.replace('"distortion": 0.09', '"distortion": NaN', 1)},
        {"name": "json/infinity", "text": valid.replace('"distortion": 0.09', '"distortion": Infinity', 1)},
        {"name": "json/trailing-data", "text": valid + " {}"},
        {"name": "json/cut", "text": valid[:-3]},
        {"name": "json/depth-65", "text": "[" * 65 + "]" * 65},
        {"name": "json/depth-64", "text": "[" * 64 + "]" * 64},
        {"name": "json/depth-in-string", "text": json.dumps({**_single(), "note": "[" * 100})},
        {"name": "json/over-max-bytes", "text": valid, "options": {"maxBytes": len(valid) - 1}},
        {"name": "json/at-max-bytes", "text": valid, "options": {"maxBytes": len(valid)}},
        {"name": "json/array", "text": "[]"},
        {"name": "json/duplicate-key-last-wins", "text": valid.replace('"version": 2', '"version": 1, "version": 2')},
        {"name": "json/proto-key", "text": valid.replace('"version": 2', '"__proto__": {"x": 1}, "version": 2')},
        {"name": "json/escaped-template-id", "text": valid.replace('"conformance"', '"conform\\u0061nce"', 1)},
        {"name": "json/bom", "bytes_hex": ("\ufeff" + valid).encode("utf-8").hex()},
        {"name": "json/not-utf8", "bytes_hex": (valid[:20].encode() + b"\xff" + valid[20:].encode()).hex()},
        {"name": "json/exponent-int", "text": valid.replace('"num_layers": 2', '"num_layers": 2e0')},
        {"name": "json/negative-zero-version", "text": valid.replace('"version": 2', '"version": -0')},
    ]
    return cases


def _outcome(case: dict) -> str:
    raw = bytes.fromhex(case["bytes_hex"]) if "bytes_hex" in case else case["text"].encode("utf-8")
    opts = case.get("options", {})
    try:
        kwargs = {"max_bytes": opts["maxBytes"]} if "maxBytes" in opts else {}
        parse_manifest(
            bounded_json(raw, "manifest", **kwargs), template_id=opts.get("templateId"), model_id=opts.get("modelId")
        )
    except ValueError as e:
        return type(e).__name__
    return "ok"


def write_manifest_vectors(out: Path) -> dict:
    """``out/manifests.json``: every case with Python's outcome (``expect``: "ok" or an error class name)."""
    cases = [{**c, "expect": _outcome(c)} for c in manifest_cases()]
    index = {"format": "sakura-manifest-vectors", "version": 1, "cases": cases}
    (out / "manifests.json").write_text(json.dumps(index))
    return index
