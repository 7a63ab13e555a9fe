"""The documents a reader trusts are checked, not hoped: the README stays a five-minute read, every repository path
and module a document cites exists, and every relative link resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "DEVELOPERS.md", *(ROOT / "docs").glob("*.md")])
README_MAX_LINES = 250

# a cited path starts at one of the repository's top-level entries
_TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci"} - {".venv"}
_PACKAGES = ("sakura_core", "cloud_server", "android_bridge", "nodes", "sakura_tools")
_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PLACEHOLDER = re.compile(r"[<>*{}$\[\]|]|\.\.\.")
_MODULE = re.compile(r"\b(?:" + "|".join(_PACKAGES) + r")(?:\.\w+)+")


def _doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def cited_paths(text: str) -> set[str]:
    """Repository paths in backticks: a first component that is a top-level entry of the repository, no placeholder;
    a trailing ``:line``, ``::test`` or ``/`` is dropped."""
    out = set()
    for span in _CODE.findall(text):
        for word in span.split():
            word = word.strip("'\",;()")
            word = re.split(r"::|:(?=\d)", word)[0].rstrip("/")
            if "/" not in word or _PLACEHOLDER.search(word) or word.split("/")[0] not in _TOP:
                continue
            out.add(word)
    return out


def cited_modules(text: str) -> set[str]:
    """Dotted names of this repository's packages in backticks (``sakura_core.edit.open_template``)."""
    out = set()
    for span in _CODE.findall(text):
        out.update(_MODULE.findall(span))
    return out


def module_resolves(dotted: str) -> bool:
    """The longest prefix of ``dotted`` that is a module or package of the repository exists, and the next name (if
    any) is defined in it or is a submodule."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if not source.is_file():
            continue
        if n == len(parts):
            return True
        name = parts[n]
        text = source.read_text()
        defined = rf"^\s*(?:async def|def|class)\s+{name}\b|^\s*{name}\s*[:=]|^\s+{name},?$|import.*\b{name}\b"
        return bool(re.search(defined, text, re.M)) or (base / f"{name}.py").is_file()
    return False


def test_the_readme_reads_in_five_minutes():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
    head = "\n".join(lines[:45]).lower()
    for word in ("real", "emulated", "simulated"):
        assert word in head, f"the README's first screen must say what is {word}"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_cited_path_exists(doc):
    missing = sorted(p for p in cited_paths(doc.read_text()) if not (ROOT / p).exists())
    assert not missing, f"{_doc_id(doc)} cites paths that are not in the repository: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_cited_module_exists(doc):
    missing = sorted(m for m in cited_modules(doc.read_text()) if not module_resolves(m))
    assert not missing, f"{_doc_id(doc)} cites modules or names that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_relative_link_resolves(doc):
    bad = []
    for target in _LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (doc.parent / target.split("#")[0]).exists():
            bad.append(target)
    assert not bad, f"{_doc_id(doc)} links to missing files: {bad}"


def test_the_checks_catch_what_they_claim_to(tmp_path):
    text = "see `sakura_core/no_such_file.py` and `sakura_core.edit.no_such_name`, `sakura_core.edit.open_template`"
    assert "sakura_core/no_such_file.py" in cited_paths(text)
    assert not (ROOT / "sakura_core/no_such_file.py").exists()
    assert not module_resolves("sakura_core.edit.no_such_name")
    assert module_resolves("sakura_core.edit.open_template")
    assert cited_paths("`~/sakura-store` `$COMFYUI_DIR/input` `<name>_report_<n>.json`") == set()


def test_no_document_cites_files_outside_the_repository():
    for doc in DOCS:
        text = doc.read_text()
        for outside in ("DESIGN.md", "shared/NOTES.md", "CONVENTIONS.md"):
            assert outside not in text, f"{_doc_id(doc)} cites {outside}, which is not in the repository"


def test_every_node_has_a_help_page_the_frontend_shows():
    """ComfyUI's frontend shows ``WEB_DIRECTORY/docs/<node id>.md`` in its node-docs panel."""
    ids = set()
    for source in (ROOT / "nodes").glob("*.py"):
        ids |= set(re.findall(r'node_id="(\w+)"', source.read_text()))
    assert len(ids) >= 5
    pages = {p.stem for p in (ROOT / "web" / "docs").glob("*.md")}
    assert ids <= pages, f"nodes without a help page in web/docs/: {sorted(ids - pages)}"
    assert pages <= ids, f"help pages of no node: {sorted(pages - ids)}"
    for page in pages:
        text = (ROOT / "web" / "docs" / f"{page}.md").read_text()
        assert text.startswith("# ") and len(text.splitlines()) >= 5, page
