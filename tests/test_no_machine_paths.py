"""No tracked file names a folder of the machine it was written on: a development machine's work folder, a home
folder (Linux, macOS, Windows) or root's home. Those paths exist nowhere else, so a command, a results JSON or a doc
that holds one does not run (or mean anything) on a fresh clone: use a path relative to the repository, a variable
(``$COMFYUI_DIR``, ``$HOME``) or a scratch path under /tmp. System paths (/usr/bin/chromium, /etc, /dev, /proc) and
/tmp are fine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ci_deps import require_or_skip

REPO = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(REPO).as_posix()
# Not after a word character, '.', '~', '$', '/' or '-': the same folder names inside a URL, a relative path, under ~
# or $HOME, or below another folder are not machine paths. The names are split so that this file does not spell them.
_BEFORE = r"(?<![\w.~$/\\-])"
MACHINE_PATH = re.compile(
    _BEFORE + r"(?:/" + "work" + r"/|/" + "root" + r"(?:/|\b)|/" + "home" + r"/[^/\s]+/|/" + "Users" + r"/[^/\s]+/"
    r"|[A-Za-z]:\\" + "Users" + r"\\[^\\\s]+\\)"
)


def _tracked_files() -> list[str]:
    require_or_skip((REPO / ".git").exists(), f"{REPO} is not a git checkout (no .git): no tracked files to check")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def _offending_lines(text: str) -> list[tuple[int, str]]:
    return [(i, line) for i, line in enumerate(text.splitlines(), 1) if MACHINE_PATH.search(line)]


def test_the_pattern_finds_machine_paths_and_spares_the_rest():
    w, r, h, u = "/" + "work", "/" + "root", "/" + "home", "/" + "Users"
    bad = [
        f"--traces {w}/shared/traces",
        f'"path": "{w}/x.json"',
        f"cd {r}/sakura",
        f"cd {r}",
        f"{h}/alice/comfyui",
        f"({u}/bob/src)",
        "C:\\" + "Users\\carol\\x",
        f"`{w}/comfyui/input`",
    ]
    good = [
        "--traces ../shared/traces",
        "/tmp/h12/init.safetensors",
        "/usr/bin/chromium",
        "/etc/nginx",
        "/dev/null",
        f"https://example.org{w}/x",
        f"$HOME{w}/comfyui",
        f"~{w}",
        f"..{r}/x",
        f"a{r}/b",
        f"{h}/",
        "--root /tmp/x",
        "/proc/self",
    ]
    assert [s for s in bad if not MACHINE_PATH.search(s)] == []
    assert [s for s in good if MACHINE_PATH.search(s)] == []


def test_no_tracked_file_holds_a_development_machine_path():
    found = []
    for rel in _tracked_files():
        path = REPO / rel
        if rel == SELF or not path.is_file() or path.is_symlink():
            continue  # this file; a tracked file deleted in the working tree; a link
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (as git grep -I)
        text = data.decode("utf-8", "replace")
        found += [f"{rel}:{i}: {line.strip()[:160]}" for i, line in _offending_lines(text)]
    assert not found, (
        "absolute paths of a development machine (use a repository-relative path, a variable or "
        "/tmp):\n" + "\n".join(found)
    )
