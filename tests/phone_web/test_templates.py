"""Whole templates decoded by the page like Python's ``decode_template``: the demo model precomputed in single and
per-step mode (reuse, residuals with the predictor, closed-loop twins), every representation name, bit for bit —
through the manifest, each chain bound to its slot and the cross-step references; a decoder that ignores the twins'
track fails."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from ci_deps import require_or_skip

from .template_vectors import write_template_vectors

WEB = Path(__file__).resolve().parents[2] / "phone_web"
NODE = shutil.which("node")


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("templates")
    return out, write_template_vectors(out)


def _run(web: Path, out: Path) -> tuple[int, dict, list]:
    require_or_skip(NODE is not None, "node is not installed (apt-get install nodejs npm)")
    require_or_skip((WEB / "node_modules" / "fzstd").is_dir(), "phone_web's npm packages are not installed (npm ci)")
    proc = subprocess.run(
        [NODE, str(web / "test" / "run_templates.mjs"), str(out)], capture_output=True, text=True, timeout=300, cwd=web
    )
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert lines and "summary" in lines[-1], proc.stderr[-2000:]
    return proc.returncode, lines[-1]["summary"], lines[:-1]


def test_every_template_name_decodes_like_python(templates):
    out, index = templates
    names = {t["name"]: set(t["expect"]) for t in index["templates"]}
    assert {"fp16", "sakura-l0", "sakura-l8"} <= names["single"]
    assert {"reuse", "sakura-l3", "sakura-l3+cl", "fp16"} <= names["per-step"]
    code, summary, failures = _run(WEB, out)
    assert code == 0 and failures == [] and summary["pass"] == summary["cases"] == sum(map(len, names.values()))


def test_a_decoder_ignoring_the_twins_track_fails(templates, tmp_path):
    web = tmp_path / "phone_web"
    shutil.copytree(WEB / "src", web / "src")
    shutil.copytree(WEB / "test", web / "test")
    shutil.copy(WEB / "package.json", web / "package.json")
    (web / "node_modules").symlink_to(WEB / "node_modules")
    source = (web / "src" / "template.js").read_text()
    old = 'const want = chosen === "reuse" && s === 0 ? "fp16" : s === 0 ? base : chosen;'
    assert source.count(old) == 1
    (web / "src" / "template.js").write_text(source.replace(old, old.replace(": chosen;", ": base;")))
    code, _, failures = _run(web, templates[0])
    assert code == 1 and failures and all(f["name"].endswith("+cl") for f in failures)
