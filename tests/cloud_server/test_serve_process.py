"""``sakura serve`` as a real process on an ephemeral 127.0.0.1 port: serves, reads its token from the environment,
and shuts down gracefully on SIGTERM/SIGINT. Also the CLI's argument errors."""

import asyncio
import hashlib
import os
import signal
import sys

import pytest
import torch

from cloud_server.config import ServerConfig
from sakura_core.cli import main
from sakura_core.fetch.client import ShardClient


async def _start_serve(store_root, *extra, env=None):
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sakura_core.cli",
        "serve",
        "--store",
        str(store_root),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--model",
        "none",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if not line.startswith(b"serving http://127.0.0.1:"):
        proc.kill()
        raise AssertionError(f"unexpected first line {line!r}: {(await proc.stderr.read()).decode()}")
    port = int(line.split()[1].rsplit(b":", 1)[1])
    return proc, port


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_serve_process_serves_and_stops_gracefully(store_arg, manifest, sig):
    proc, port = await _start_serve(store_arg, env={"SAKURA_TOKEN": "env-token-123"})
    try:
        async with ShardClient(f"http://127.0.0.1:{port}") as client:
            catalog = await client.get_catalog()
            assert [t["id"] for t in catalog["templates"]] == ["tpl-a"]
            rep = manifest["shards"][0]["representations"][0]
            data = await client.fetch_shard(rep["digest"])
            assert hashlib.sha256(data).hexdigest() == rep["digest"]
            session = client._get_session()
            async with session.get(f"http://127.0.0.1:{port}/healthz") as r:
                assert (await r.json())["write"] is True  # token taken from SAKURA_TOKEN
            async with session.post(f"http://127.0.0.1:{port}/v1/templates?id=x", data=b"x") as r:
                assert r.status == 401
        proc.send_signal(sig)
        rc = await asyncio.wait_for(proc.wait(), 30)
        out = (await proc.stdout.read()).decode()
        assert rc == 0 and "stopped" in out
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_sigterm_drains_an_in_flight_download(store, store_arg, tmp_path):
    """A shard being downloaded when SIGTERM arrives is completed (graceful shutdown), then the process exits."""
    blob = os.urandom(8 * 2**20)
    digest = hashlib.sha256(blob).hexdigest()
    store.put_shard(digest, blob)
    proc, port = await _start_serve(store_arg)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET /v1/shards/{digest} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        first = await reader.readexactly(2**16)
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)  # slow reader: the server is draining meanwhile
        rest = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        assert first + rest == blob
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_cli_argument_errors(tmp_path, capsys):
    assert main(["serve", "--store", str(tmp_path), "--model", "flux-9b"]) == 2
    assert "unknown model 'flux-9b'" in capsys.readouterr().err
    assert main(["serve", "--store", str(tmp_path), "--host", "localhost"]) == 2
    assert "host must be an IP address" in capsys.readouterr().err
    assert main(["precompute", "--store", str(tmp_path), "--model", "sd15", "--image", "x.png", "--id", "a"]) == 2
    assert "unknown model 'sd15'" in capsys.readouterr().err
    assert main(["precompute", "--store", str(tmp_path), "--image", "x.png", "--id", "../etc"]) == 2
    assert "invalid template id" in capsys.readouterr().err
    assert main(["precompute", "--store", str(tmp_path), "--image", "no-such.png", "--id", "ok"]) == 2
    assert "image file 'no-such.png' not found" in capsys.readouterr().err
    assert main(["serve", "--store", str(tmp_path), "--device", "tpu"]) == 2
    assert "unknown device 'tpu'" in capsys.readouterr().err
    assert main(["serve", "--store", "gs://bucket/x"]) == 2
    assert "s3://" in capsys.readouterr().err
    assert main(["precompute", "--store", "s3://Bad_Bucket", "--image", "astronaut", "--id", "ok"]) == 2
    assert "invalid bucket name" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["serve", "--store", str(tmp_path), "--device", "cuda", "--port", "0"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(port=70000), "port"),
        (dict(host="0.0.0.0.0"), "host"),
        (dict(write_token="short"), "write_token"),
        (dict(read_token="has space x"), "read_token"),
        (dict(model="sdxl"), "sdxl"),
        (dict(max_upload_bytes=0), "max_upload_bytes"),
        (dict(max_header_bytes=100), "max_header_bytes"),
        (dict(catalog_ttl_s=-1), "catalog_ttl_s"),
    ],
)
def test_server_config_validation(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServerConfig(store_dir=tmp_path, **kwargs)
