"""What a store's templates occupy: per template its storage figures (``sakura_core.kv.storage.template_storage``:
store profile, KV mode, bytes stored, ratio to its uncompressed fp16 KV, floor and top PSNR) and totals by KV mode
and store profile. ``sakura store usage`` prints it; ``sakura precompute`` prints one template's line."""

from __future__ import annotations

from sakura_core.kv.manifest import Manifest, ManifestError, blob_digests, parse_manifest
from sakura_core.kv.storage import template_storage

from .store import Store, StoreError

__all__ = ["format_storage", "format_usage", "store_usage"]


def store_usage(store: Store) -> dict:
    """``templates``: every published template's figures (id order); ``by``: totals per (KV mode, store profile) of
    ``templates``, ``stored_bytes`` and ``fp16_kv_bytes``; ``total``: the same over the store (``stored_bytes`` is the
    sum of the templates' figures) plus ``distinct_bytes`` (each blob once over the whole store: templates may share
    blobs); ``unreadable``: template id -> why its manifest could not be read."""
    rows, unreadable, sizes = [], {}, {}
    for template_id in sorted(store.list_templates()):
        try:
            manifest = parse_manifest(store.get_manifest(template_id), template_id=template_id)
        except (ManifestError, StoreError, ValueError) as e:
            unreadable[template_id] = str(e)
            continue
        rows.append(template_storage(manifest.to_json()))  # the figures a publisher's JSON gives (one home)
        sizes.update(_blob_sizes(manifest))
    by: dict[tuple[str, str], dict] = {}
    for r in rows:
        t = by.setdefault((r["kv_mode"], r["profile"]), _zero(r["kv_mode"], r["profile"]))
        _add(t, r)
    total = _zero("all", "all")
    for r in rows:
        _add(total, r)
    total["distinct_bytes"] = sum(sizes.values())
    return {"templates": rows, "by": [by[k] for k in sorted(by)], "total": total, "unreadable": unreadable}


def _blob_sizes(manifest: Manifest) -> dict[str, int]:
    """Every blob the manifest names (:func:`blob_digests`) with its bytes."""
    digests = set(blob_digests(manifest))
    return {r.digest: r.nbytes for sh in manifest.shards for r in sh.representations if r.digest in digests}


def _zero(kv_mode: str, profile: str) -> dict:
    return {"kv_mode": kv_mode, "profile": profile, "templates": 0, "stored_bytes": 0, "fp16_kv_bytes": 0}


def _add(total: dict, row: dict) -> None:
    total["templates"] += 1
    total["stored_bytes"] += row["stored_bytes"]
    total["fp16_kv_bytes"] += row["fp16_kv_bytes"]
    total["x_fp16"] = round(total["stored_bytes"] / total["fp16_kv_bytes"], 4)


def _db(x) -> str:
    return "-" if x is None else f"{x:.2f} dB"


def format_storage(row: dict) -> str:
    """One template's figures in a sentence (what ``sakura precompute`` prints)."""
    kept = "the fp16 included" if row["fp16_stored"] else "no fp16"
    return (
        f"stored (store profile {row['profile']}, {kept}): {row['stored_bytes']} bytes, {row['x_fp16']:.3f}x the "
        f"template's uncompressed fp16 KV in {row['kv_mode']} mode ({row['fp16_kv_bytes']} bytes; "
        f"1/{1 / row['x_fp16']:.2f}); floor {row['floor']} {_db(row['floor_psnr_db'])}, top {row['top']} "
        f"{_db(row['top_psnr_db'])}"
    )


def format_usage(usage: dict) -> str:
    """The table ``sakura store usage`` prints: a row per template, then the totals by KV mode and store profile."""
    head = f"{'template':<28}{'mode':<10}{'profile':<9}{'stored B':>12}{'fp16 KV B':>12}{'x fp16':>8}  floor / top"
    lines = [head]
    for r in usage["templates"]:
        lines.append(
            f"{r['template_id']:<28}{r['kv_mode']:<10}{r['profile']:<9}{r['stored_bytes']:>12}"
            f"{r['fp16_kv_bytes']:>12}{r['x_fp16']:>8.3f}  {r['floor']} {_db(r['floor_psnr_db'])} / "
            f"{r['top']} {_db(r['top_psnr_db'])}"
        )
    lines.append("totals:")
    for t in [*usage["by"], usage["total"]]:
        x = f"{t['x_fp16']:>8.3f}" if t["templates"] else f"{'-':>8}"
        lines.append(
            f"  {t['kv_mode']:<10}{t['profile']:<9}{t['templates']:>5} templates{t['stored_bytes']:>14}"
            f"{t['fp16_kv_bytes']:>14}{x}"
        )
    lines.append(
        f"  distinct blob bytes over the store (blobs shared by templates counted once): "
        f"{usage['total']['distinct_bytes']}"
    )
    for template_id, why in usage["unreadable"].items():
        lines.append(f"  template {template_id}: unreadable manifest: {why}")
    return "\n".join(lines)
