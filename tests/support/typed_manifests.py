"""A typed :class:`~sakura_core.kv.manifest.Manifest` of a hand-written, partial manifest for unit tests of its
readers (the ladders, the phone timing, the decode lane): built without the schema, which such a fixture would not
pass (short digests, a header reduced to the fields under test). Real manifests come from ``parse_manifest``.
This folder is on ``sys.path`` through ``pythonpath`` in pyproject.toml's pytest settings.
"""

from __future__ import annotations

from sakura_core.kv.manifest import Manifest, Reference, Schedule
from sakura_core.kv.manifest_leaves import shard_from_json
from sakura_core.models.ref_layout import grids_of

__all__ = ["unchecked_manifest"]


def unchecked_manifest(m: dict) -> Manifest:
    """``m`` typed as the parser would, unchecked; absent header fields take neutral values."""
    grid = tuple(m.get("token_grid", (1, 1)))
    layout = m.get("rope_layout", "flux2-ref-t10")
    refs, offset = [], 0
    for i, (rows, cols) in enumerate(grids_of(grid, layout)):
        refs.append(Reference((rows, cols), 10 * (i + 1), offset, rows * cols))
        offset += rows * cols
    sched = m.get("schedule")
    schedule = None
    if m.get("kv_mode") == "per-step":
        steps = sched["steps"]
        schedule = Schedule(steps, tuple(sched.get("timesteps", [1.0] * steps)), sched.get("shift", 1.0))
    return Manifest(
        _json=m,
        model_id=m.get("model_id", "00"),
        template_id=m.get("template_id", "t"),
        token_grid=grid,
        rope_layout=layout,
        num_layers=m.get("num_layers", 1),
        heads=m.get("heads", 1),
        head_dim=m.get("head_dim", 1),
        codec=m.get("codec", "sakura"),
        kv_mode=m.get("kv_mode", "single"),
        schedule=schedule,
        references=tuple(refs),
        shards=tuple(shard_from_json(sh) for sh in m.get("shards", [])),
    )
