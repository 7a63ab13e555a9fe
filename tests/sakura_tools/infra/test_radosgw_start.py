"""``RadosGateway``'s start-up is robust to a monitor that refuses a command now and then: a failing ``ceph`` CLI
command is tried again, a failed start is made again from scratch, and what is finally raised carries the monitor's
log. Runs without Ceph: the programs are small stand-in scripts (the real cluster is the ``radosgw`` fixture's)."""

import stat
import sys

import pytest

from sakura_tools.infra import radosgw as rgw_mod
from sakura_tools.infra.radosgw import RadosGateway, RadosGatewayError


def _script(path, body: str):
    path.write_text(f"#!{sys.executable}\nimport sys, pathlib\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def gw(tmp_path, monkeypatch):
    monkeypatch.setattr(rgw_mod, "missing_ceph_binaries", lambda: [])
    monkeypatch.setattr(rgw_mod.time, "sleep", lambda s: None)
    gw = RadosGateway(tmp_path / "gw")
    gw.dir.mkdir()
    return gw


def _fails_first(tmp_path, n_failures: int):
    counter = tmp_path / "calls"
    return _script(
        tmp_path / "ceph",
        f"c = pathlib.Path({str(counter)!r}); n = int(c.read_text()) if c.exists() else 0; c.write_text(str(n + 1))\n"
        f"if n < {n_failures}:\n"
        "    sys.stderr.write('Error EPERM: problem getting command descriptions from mon.'); sys.exit(1)\n"
        "print('0')",
    ), counter


def test_a_ceph_command_refused_twice_is_tried_again(gw, tmp_path, monkeypatch):
    prog, counter = _fails_first(tmp_path, 2)
    monkeypatch.setattr(gw, "_argv", lambda name, *args: [str(prog), *args])
    assert gw._run("ceph", "osd", "new", "u").strip() == "0"
    assert counter.read_text() == "3"


def test_a_ceph_command_that_keeps_failing_raises_with_the_mon_log(gw, tmp_path, monkeypatch):
    prog, counter = _fails_first(tmp_path, 100)
    (gw.dir / "mon.a.log").write_text("mon.a@0(leader) handle_command on fsid X != Y")
    monkeypatch.setattr(gw, "_argv", lambda name, *args: [str(prog), *args])
    with pytest.raises(RadosGatewayError, match=r"(?s)osd crush add .*EPERM.*handle_command on fsid"):
        gw._run("ceph", "osd", "crush", "add")
    assert counter.read_text() == str(rgw_mod._CLI_TRIES)


def test_other_programs_are_not_retried(gw, tmp_path, monkeypatch):
    prog, counter = _fails_first(tmp_path, 1)
    monkeypatch.setattr(gw, "_argv", lambda name, *args: [str(prog), *args])
    with pytest.raises(RadosGatewayError, match="ceph-mon --mkfs"):
        gw._run("ceph-mon", "--mkfs")
    assert counter.read_text() == "1"


def test_a_failed_start_is_made_again_from_scratch(gw, monkeypatch):
    calls = []

    def once():
        calls.append(1)
        if len(calls) == 1:
            raise RadosGatewayError("the OSD did not come up")

    monkeypatch.setattr(gw, "_start_once", once)
    assert gw.start() is gw
    assert len(calls) == 2
    with pytest.raises(RadosGatewayError, match="did not come up"):
        calls.clear()
        monkeypatch.setattr(gw, "_start_once", lambda: (_ for _ in ()).throw(RadosGatewayError("did not come up")))
        gw.start(attempts=2)
    with pytest.raises(ValueError, match="attempts must be >= 1, got 0"):
        gw.start(attempts=0)
