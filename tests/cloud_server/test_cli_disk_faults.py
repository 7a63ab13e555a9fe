"""The CLIs on a full, read-only or forbidden disk and on inputs that are not images (issue 28): one line on stderr,
exit != 0, no traceback, no temp file or half-written output left. A store or output folder that cannot be written
is said before the compute; a disk that fills up at the end is still one line. ``precompute`` runs here with a
stand-in model and codec (instant), the real ENOSPC on a small tmpfs in a mount namespace of its own (as root)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cloud_server.cli_precompute as cli_precompute
import cloud_server.precompute as precompute_module
from cloud_server.store import LocalStore
from sakura_core.cli import main

from ..readonly import read_only
from ..synthetic_templates import SyntheticModel, synthetic_precompute
from .conftest import MODEL_ID

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def fast_precompute(monkeypatch):
    """``sakura precompute`` with the synthetic model and codec: its writes are the real ones, the compute instant."""
    loads = []

    def load_model(*args, **kwargs):
        loads.append(args)
        return SyntheticModel(MODEL_ID)

    monkeypatch.setattr(cli_precompute, "load_model", load_model)
    monkeypatch.setattr(precompute_module, "_default_precompute_fn", lambda: synthetic_precompute)
    return loads


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _one_line(err: str, starts: str) -> None:
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith(starts), err


def test_precompute_into_a_read_only_store_says_so_before_the_compute(tmp_path, fast_precompute, capsys):
    store = LocalStore(tmp_path / "store")
    before = _files(store.root)
    with read_only(store.root) as errno_name:
        rc = main(["precompute", "--store", str(store.root), "--image", "astronaut", "--id", "tpl-1"])
    out, err = capsys.readouterr()
    assert rc == 1, err  # main: a PermissionError traceback after the compute
    _one_line(err, f"sakura precompute: the store cannot be written: {store.root}: ")
    assert f"({errno_name})" in err and not fast_precompute and "loaded" not in out  # nothing computed
    assert _files(store.root) == before


def test_precompute_json_into_a_read_only_folder_says_so_first(tmp_path, fast_precompute, capsys):
    (tmp_path / "out").mkdir()
    with read_only(tmp_path / "out"):
        rc = main(
            [
                "precompute",
                "--store",
                str(tmp_path / "store"),
                "--image",
                "astronaut",
                "--id",
                "tpl-1",
                "--json",
                str(tmp_path / "out" / "levels.json"),
            ]
        )
    err = capsys.readouterr().err
    assert rc == 1 and not fast_precompute, err
    _one_line(err, f"sakura precompute: cannot write levels.json there: {tmp_path / 'out'}: ")
    assert not LocalStore(tmp_path / "store").list_templates()


def test_a_disk_that_fills_up_at_the_end_is_one_line_and_leaves_no_temp_file(
    tmp_path, fast_precompute, capsys, monkeypatch
):
    real_fsync, calls = os.fsync, []

    def fsync(fd):  # the 4th file written finds the disk full (shards are written before the manifest)
        calls.append(fd)
        if len(calls) == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    rc = main(["precompute", "--store", str(tmp_path / "store"), "--image", "astronaut", "--id", "tpl-1"])
    err = capsys.readouterr().err
    assert rc == 1 and fast_precompute, err  # main: an OSError traceback
    _one_line(err, "sakura precompute: No space left on device (ENOSPC): free some space, and run it again")
    store = LocalStore(tmp_path / "store")
    assert not [f for f in _files(store.root) if f.endswith(".tmp")]  # the temp file of the failed write is gone
    assert store.list_templates() == []  # nothing published


_FULL_DISK = """
import sys; sys.path.insert(0, {tests!r})
import cloud_server.cli_precompute as c, cloud_server.precompute as p
from synthetic_templates import SyntheticModel, synthetic_precompute
c.load_model = lambda *a, **k: SyntheticModel({model!r}); p._default_precompute_fn = lambda: synthetic_precompute
from sakura_core.cli import main; sys.exit(main(sys.argv[1:]))
"""


def test_a_real_full_disk(tmp_path):
    """ENOSPC from a real file system: a 96 KiB tmpfs in a private mount namespace (root and unshare needed)."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("a real full disk needs root and unshare(1) (a tmpfs in a private mount namespace)")
    disk = tmp_path / "disk"
    disk.mkdir()
    code = _FULL_DISK.format(tests=str(TESTS), model=MODEL_ID)
    script = (
        'mount -t tmpfs -o size=96k tmpfs "$1" || exit 99; shift; "$@"; echo "rc=$?"; '
        'find "$0" -name "*.tmp" | wc -l; ls "$0/store/templates" | wc -l'
    )
    argv = [
        unshare,
        "-m",
        "sh",
        "-c",
        script,
        str(disk),
        str(disk),
        sys.executable,
        "-c",
        code,
        "precompute",
        "--store",
        str(disk / "store"),
        "--image",
        "astronaut",
        "--id",
        "tpl-1",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if proc.returncode == 99:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()[:200]}")
    rc, temp_files, templates = proc.stdout.strip().splitlines()[-3:]
    assert rc == "rc=1", proc.stdout + proc.stderr
    _one_line(proc.stderr, "sakura precompute: ")
    assert "No space left on device (ENOSPC)" in proc.stderr and "free some space" in proc.stderr
    assert temp_files == "0"  # no temp file left on the full disk
    assert templates == "0"  # nothing published (no folder with a manifest)


@pytest.mark.parametrize("bad", ["text", "random"])
def test_non_images_anywhere_the_cli_takes_one(tmp_path, capsys, bad):
    path = tmp_path / ("x.png" if bad == "text" else "x.jpg")
    path.write_bytes(b"not an image\n" if bad == "text" else os.urandom(5000))
    for argv, starts in (
        (["demo", "--out", str(tmp_path / "o1"), "--template", str(path), "--no-served"], "sakura demo: "),
        (["demo", "--out", str(tmp_path / "o2"), "--user", str(path), "--no-served"], "sakura demo: "),
        (["precompute", "--store", str(tmp_path / "st"), "--image", str(path), "--id", "t"], "sakura precompute: "),
    ):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2, (argv, err)  # main: sakura demo ended in an ImageError traceback
        _one_line(
            err, starts + f"image file {str(path)!r} is not a readable image" if "precompute" in argv else starts
        )
        assert "is not a readable image" in err
