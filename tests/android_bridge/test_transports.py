"""Transports behind one interface: spec parsing, the URL transport, and the adb transport on a fake adb client."""

import pytest

from android_bridge.transports import (
    DEFAULT_AGENT_PORT,
    AdbTransport,
    TransportError,
    UrlTransport,
    list_adb_devices,
    transport_from_spec,
)


class Info:
    def __init__(self, serial, state, model=""):
        self.serial, self.state, self.tags = serial, state, {"model": model}


class Device:
    def __init__(self, serial, local_port=40001, fail=False):
        self.serial, self.local_port, self.fail = serial, local_port, fail
        self.calls = []

    def forward_port(self, remote):
        self.calls.append(("forward", remote))
        if self.fail:
            raise OSError("device offline")
        return self.local_port

    def forward_remove(self, local, raise_non_found=True):
        self.calls.append(("remove", local, raise_non_found))


class Adb:
    def __init__(self, *infos, devices=None):
        self.infos = list(infos)
        self.devices = devices or {i.serial: Device(i.serial) for i in infos}

    def list(self, extended=False):
        assert extended
        return self.infos

    def device(self, serial=None):
        return self.devices[serial]


@pytest.mark.parametrize(
    ("spec", "kind", "serial", "port"),
    [
        ("adb", "adb", None, DEFAULT_AGENT_PORT),
        ("adb:R5CW123", "adb", "R5CW123", DEFAULT_AGENT_PORT),
        ("adb@9000", "adb", None, 9000),
        ("adb:10.0.0.5:5555@9001", "adb", "10.0.0.5:5555", 9001),
        ("http://127.0.0.1:8765", "url", None, None),
        ("https://phone.local:443/", "url", None, None),
    ],
)
def test_spec_parsing(spec, kind, serial, port):
    t = transport_from_spec(spec)
    assert t.kind == kind
    if kind == "adb":
        assert (t.serial, t.remote_port) == (serial, port)


@pytest.mark.parametrize("spec", ["", "bluetooth://x", "ftp://1.2.3.4", "adb@port", "http://h:1/v1/info", "adb@0"])
def test_bad_specs_say_what_to_write(spec):
    with pytest.raises(TransportError, match="http|adb|port|base URL"):
        transport_from_spec(spec)


def test_url_transport_is_a_no_op_path(caplog):
    t = UrlTransport("http://127.0.0.1:8765/")
    assert t.open() == "http://127.0.0.1:8765" and t.describe()["loopback"] is True
    UrlTransport("http://192.0.2.7:8765")  # TEST-NET address: only parsed, never contacted
    assert "unencrypted" in caplog.text


def test_adb_forward_to_the_only_device_and_removal_on_close():
    adb = Adb(Info("R5CW123", "device", "SM_S938B"), Info("emulator-5554", "offline"))
    t = AdbTransport(client=adb, remote_port=8765)
    with t as url:
        assert url == "http://127.0.0.1:40001" and t.serial == "R5CW123"
        assert t.describe() == {"transport": "adb", "serial": "R5CW123", "remote_port": 8765, "local_port": 40001}
    assert adb.devices["R5CW123"].calls == [("forward", 8765), ("remove", "tcp:40001", False)]
    assert t.local_port is None


def test_adb_device_choice_errors_are_specific():
    with pytest.raises(TransportError, match="no adb device attached"):
        AdbTransport(client=Adb()).open()
    two = Adb(Info("A", "device"), Info("B", "device"))
    with pytest.raises(TransportError, match="2 adb devices attached .*adb:SERIAL"):
        AdbTransport(client=two).open()
    assert AdbTransport("B", client=two).open() == "http://127.0.0.1:40001"
    with pytest.raises(TransportError, match="no adb device 'C' \\(attached: A, B\\)"):
        AdbTransport("C", client=two).open()
    with pytest.raises(TransportError, match="unauthorized; unlock it"):
        AdbTransport("X", client=Adb(Info("X", "unauthorized"))).open()
    broken = Adb(Info("Z", "device"), devices={"Z": Device("Z", fail=True)})
    with pytest.raises(TransportError, match="adb forward to Z:8765 failed: device offline"):
        AdbTransport("Z", client=broken).open()


def test_list_adb_devices_reports_state_and_model():
    rows = list_adb_devices(Adb(Info("R5CW123", "device", "SM_S938B"), Info("emulator-5554", "offline")))
    assert rows == [
        {"serial": "R5CW123", "state": "device", "model": "SM_S938B", "transport_id": None},
        {"serial": "emulator-5554", "state": "offline", "model": "", "transport_id": None},
    ]

    class Down:
        def list(self, extended=False):
            raise ConnectionRefusedError("127.0.0.1:5037")

    with pytest.raises(TransportError, match="adb start-server"):
        list_adb_devices(Down())


def test_phone_run_with_no_adb_phone_ends_with_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    from PIL import Image

    import android_bridge.transports as transports
    from sakura_core.cli import main

    monkeypatch.setattr(transports, "_default_adb_client", lambda host, port: Adb())  # adb runs, no phone attached
    Image.new("RGB", (32, 32), "white").save(tmp_path / "user.png")
    argv = [
        "phone",
        "run",
        "--agent",
        "adb",
        "--token",
        "t" * 16,
        "--cloud",
        "http://127.0.0.1:9",
        "--template",
        "t",
        "--image",
        str(tmp_path / "user.png"),
        "--prompt",
        "p",
        "--out",
        str(tmp_path / "o.png"),
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "no adb device attached" in err and "Traceback" not in err
    assert not (tmp_path / "o.png").exists()
