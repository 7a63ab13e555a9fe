"""Tokens stay out of shared files: the nodes read them from the environment or ComfyUI's user folder by default, so a
saved workflow (and the PNG metadata ComfyUI writes from it) holds an empty token field."""

from __future__ import annotations

import json
import sys

import pytest

from .conftest import REPO, TEMPLATE, start_process, stop_process

READ_TOKEN = "read-token-for-the-test-42"


@pytest.fixture
def user_dir(comfy, tmp_path, monkeypatch):
    monkeypatch.setattr(comfy.folder_paths, "user_directory", str(tmp_path))
    monkeypatch.delenv("SAKURA_READ_TOKEN", raising=False)
    monkeypatch.delenv("SAKURA_PHONE_TOKEN", raising=False)
    return tmp_path


def test_token_precedence(comfy, user_dir, monkeypatch):
    resolve = comfy.nodes._common.resolve_token
    assert resolve("", "SAKURA_READ_TOKEN") is None
    (user_dir / "sakura_tokens.json").write_text(json.dumps({"SAKURA_READ_TOKEN": "from-file"}))
    assert resolve("  ", "SAKURA_READ_TOKEN") == "from-file"
    assert resolve("", "SAKURA_PHONE_TOKEN") is None
    monkeypatch.setenv("SAKURA_READ_TOKEN", "from-env")
    assert resolve("", "SAKURA_READ_TOKEN") == "from-env"
    assert resolve(" typed ", "SAKURA_READ_TOKEN") == "typed"


def test_the_token_source_is_named(comfy, user_dir, monkeypatch):
    source = comfy.nodes._common.resolve_token_source
    path = user_dir / "sakura_tokens.json"
    assert source("", "SAKURA_READ_TOKEN") == (
        None,
        f"no token was found (the token field, $SAKURA_READ_TOKEN and SAKURA_READ_TOKEN in {path} are all empty)",
    )
    path.write_text(json.dumps({"SAKURA_READ_TOKEN": "from-file"}))
    assert source("", "SAKURA_READ_TOKEN") == ("from-file", f"SAKURA_READ_TOKEN in {path}")
    monkeypatch.setenv("SAKURA_READ_TOKEN", "from-env")
    assert source("", "SAKURA_READ_TOKEN") == ("from-env", "$SAKURA_READ_TOKEN in ComfyUI's environment")
    assert source("t", "SAKURA_READ_TOKEN") == ("t", "the token typed into the node's token field")


def test_a_broken_tokens_file_says_what_it_must_hold(comfy, user_dir):
    (user_dir / "sakura_tokens.json").write_text('["not", "an object"]')
    with pytest.raises(comfy.nodes._common.SakuraNodeError, match=r"sakura_tokens.json: it must hold a JSON object"):
        comfy.nodes._common.resolve_token("", "SAKURA_PHONE_TOKEN")
    (user_dir / "sakura_tokens.json").write_text("{")
    with pytest.raises(comfy.nodes._common.SakuraNodeError, match="is unreadable"):
        comfy.nodes._common.resolve_token("", "SAKURA_PHONE_TOKEN")


def test_shipped_workflows_carry_no_token(node_classes):
    for node_id in ("SakuraTemplateLoader", "SakuraPhoneDevice"):
        token = next(i for i in node_classes[node_id].GET_SCHEMA().inputs if i.id == "token")
        assert token.default == "" and "saved in the workflow" in token.tooltip
    for path in sorted((REPO / "example_workflows").rglob("*.json")):
        wf = json.loads(path.read_text())
        if "nodes" in wf:
            for node in wf["nodes"]:
                if node["type"] == "SakuraTemplateLoader":
                    assert node["widgets_values"][3] == "", path  # model is a socket; token is the 4th widget
                if node["type"] == "SakuraPhoneDevice":
                    assert node["widgets_values"][1] == "", path
        else:
            for node in wf.values():
                assert node["inputs"].get("token", "") == "", path


@pytest.fixture(scope="module")
def guarded_server(store_dir):
    """``sakura serve`` over the same store, requiring a read token."""
    argv = [
        sys.executable,
        "-m",
        "sakura_core.cli",
        "serve",
        "--store",
        str(store_dir),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--model",
        "demo",
        "--read-token",
        READ_TOKEN,
    ]
    proc, url, _ = start_process(argv, r"serving (http://\S+)", "sakura serve")
    try:
        yield url
    finally:
        stop_process(proc)


@pytest.mark.slow
def test_template_loader_reads_the_server_token_from_the_environment(
    comfy, flow, demo_model, guarded_server, user_dir, monkeypatch
):
    err = comfy.nodes._common.SakuraNodeError
    with pytest.raises(
        err,
        match=rf"server at {guarded_server} requires a token \(HTTP 401\) and no token was found "
        r".*: set \$SAKURA_READ_TOKEN",
    ):
        flow.load_template(demo_model, server_url=guarded_server)
    (user_dir / "sakura_tokens.json").write_text(json.dumps({"SAKURA_READ_TOKEN": "stale-token"}))
    with pytest.raises(err, match=r"refused SAKURA_READ_TOKEN in .*sakura_tokens.json \(HTTP 401\): it is not"):
        flow.load_template(demo_model, server_url=guarded_server)
    monkeypatch.setenv("SAKURA_READ_TOKEN", "wrong-env-token")
    with pytest.raises(err, match=r"refused \$SAKURA_READ_TOKEN in ComfyUI's environment \(HTTP 401\)"):
        flow.load_template(demo_model, server_url=guarded_server)
    monkeypatch.setenv("SAKURA_READ_TOKEN", READ_TOKEN)
    template = flow.load_template(demo_model, server_url=guarded_server)
    assert template.template_id == TEMPLATE and template.source.token == READ_TOKEN
    assert READ_TOKEN not in repr(template)


@pytest.mark.slow
def test_phone_device_reads_the_pairing_token_from_the_user_folder(
    node_classes, run_node, user_dir, phone_url, phone_token
):
    (user_dir / "sakura_tokens.json").write_text(json.dumps({"SAKURA_PHONE_TOKEN": phone_token}))
    (device,) = run_node(node_classes["SakuraPhoneDevice"], connection=phone_url, token="", cloud_url="")
    assert device.info()["model"]["id"] and phone_token not in repr(device)


@pytest.mark.slow
async def test_the_template_chooser_says_the_server_needs_a_token(comfy, guarded_server, user_dir):
    token, source = comfy.nodes._common.resolve_token_source("", "SAKURA_READ_TOKEN")
    body = await comfy.nodes.routes.list_published(guarded_server, token, source)
    assert body["templates"] == []
    assert body["error"].startswith(f"the SAKURA server at {guarded_server} requires a token (HTTP 401)")
    assert "type it into" not in body["error"]  # the browser never sends a node's token field
