"""The shipped workflows' notes name the levels a run fetches (the template's quality floor, picked from its manifest
as the client picks it): a ladder change that moves the floor makes this fail until the notes say the new names
(``.venv/bin/python tests/nodes/workflows.py`` regenerates the files)."""

from __future__ import annotations

import re

import pytest

from sakura_core.kv.names import base_level_name
from sakura_core.precompute.cross_step import floor_level, level_totals

pytestmark = pytest.mark.slow

NOTES = {  # workflow -> the template it loads (the workflows whose notes name levels)
    "sakura_face_swap_per_step": "face-swap-astronaut-per-step",
}


def test_notes_name_the_templates_floor(tmp_path, examples, demo_model, workflow_defs):
    from cloud_server.store import LocalStore

    examples.publish_examples(tmp_path, demo_model, list(NOTES.values()))
    store = LocalStore(tmp_path)
    for workflow, template in NOTES.items():
        floor = floor_level(level_totals(store.get_manifest(template)), 35.0)["name"]
        expected = {floor, base_level_name(floor)}  # a twin's track starts at step 0's level
        note = next(n for n in workflow_defs.WORKFLOWS[workflow] if n.type == "Note").values["text"]
        named = set(re.findall(r"sakura-l\d+(?:\+cl)?", note))
        assert named == expected, f"{workflow}: the note names {sorted(named)}, the floor is {floor}"
