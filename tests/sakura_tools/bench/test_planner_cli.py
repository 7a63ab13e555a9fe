"""``sakura bench planner``: its JSON keeps an earlier planner's rows (``--before``) beside the new ones, the README's
planner table shows both, and a file that is not a planner JSON is refused naming it (nothing written)."""

import json

from sakura_core.cli import main
from sakura_tools.bench.results_doc import planner_table


def _run(tmp_path, *extra):
    out = tmp_path / "planner.json"
    rc = main(["bench", "planner", "--steps", "1", "--json", str(out), *extra])
    return rc, out


def test_before_rows_are_kept_beside_the_new_ones_and_rendered(tmp_path):
    rc, first = _run(tmp_path)
    assert rc == 0
    old = json.loads(first.read_text())
    old["rows"][0]["decisions"] = 98765  # mark the earlier planner's row
    old["before"] = {"rows": []}  # a chain is cut: only one earlier planner is kept
    before = tmp_path / "before.json"
    before.write_text(json.dumps(old))
    out = tmp_path / "after.json"
    assert main(["bench", "planner", "--steps", "1", "--json", str(out), "--before", str(before)]) == 0
    data = json.loads(out.read_text())
    assert data["before"]["rows"][0]["decisions"] == 98765 and "before" not in data["before"]
    assert data["rows"][0]["decisions"] != 98765
    table = planner_table(data)
    assert "| before | 1 x 25 | 98765 |" in table and f"| after | 1 x 25 | {data['rows'][0]['decisions']} |" in table


def test_a_before_file_that_is_no_planner_json_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"results": []}))
    rc, out = _run(tmp_path, "--before", str(bad))
    assert rc == 2 and not out.exists()
    assert f"--before {bad}: no 'rows' list" in capsys.readouterr().out
    bad.write_text(json.dumps({"rows": [{"steps": 4}]}))
    rc, out = _run(tmp_path, "--before", str(bad))
    assert rc == 2 and not out.exists() and "row 0 lacks" in capsys.readouterr().out
