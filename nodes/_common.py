"""Helpers shared by the Sakura nodes: socket types, the node error, image conversion, async work off ComfyUI's loop.

ComfyUI calls a synchronous ``execute`` from inside the event loop of its prompt worker, so a node must not call
``asyncio.run`` there: :func:`run_async` runs a coroutine on a fresh loop in a worker thread and waits for it,
checking ComfyUI's interrupt flag while it waits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
from comfy_api.latest import io

__all__ = [
    "CATEGORY",
    "SakuraDevice",
    "SakuraKVStream",
    "SakuraModel",
    "SakuraNodeError",
    "SakuraTemplate",
    "image_from_comfy",
    "image_to_comfy",
    "PHONE_TOKEN_ENV",
    "READ_TOKEN_ENV",
    "TOKENS_FILE",
    "refused_token_message",
    "resolve_token",
    "resolve_token_source",
    "run_async",
    "start_async",
    "wait_interruptible",
]

logger = logging.getLogger(__name__)

CATEGORY = "sakura"
READ_TOKEN_ENV = "SAKURA_READ_TOKEN"  # the SAKURA server's read token (what `sakura serve` reads it from too)
PHONE_TOKEN_ENV = "SAKURA_PHONE_TOKEN"  # the phone agent's pairing token (likewise for `sakura phone-agent`)
TOKENS_FILE = "sakura_tokens.json"  # in ComfyUI's user folder: {"SAKURA_READ_TOKEN": "...", ...}
_TOKENS_FORMAT = (
    f'it must hold a JSON object of strings, e.g. {{"{READ_TOKEN_ENV}": "...", "{PHONE_TOKEN_ENV}": "..."}}'
)

SakuraModel = io.Custom("SAKURA_MODEL")
SakuraTemplate = io.Custom("SAKURA_TEMPLATE")
SakuraKVStream = io.Custom("SAKURA_KV_STREAM")
SakuraDevice = io.Custom("SAKURA_DEVICE")

POLL_S = 0.05  # how often a waiting node checks ComfyUI's interrupt flag and updates its progress bar


class SakuraNodeError(RuntimeError):
    """A Sakura node cannot do what it was asked; the message says what to change."""


def _user_tokens() -> tuple[dict, str]:
    """(``{env name: token}`` from ``TOKENS_FILE`` in ComfyUI's user folder, its path); ``{}`` when absent."""
    import folder_paths

    user_dir = folder_paths.get_user_directory()
    if not user_dir:
        return {}, ""
    path = os.path.join(user_dir, TOKENS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            tokens = json.load(f)
    except FileNotFoundError:
        return {}, path
    except (OSError, ValueError) as e:
        raise SakuraNodeError(f"{path} is unreadable ({e}); {_TOKENS_FORMAT}") from e
    if not isinstance(tokens, dict) or not all(isinstance(v, str) for v in tokens.values()):
        raise SakuraNodeError(f"{path}: {_TOKENS_FORMAT}")
    return tokens, path


def resolve_token_source(typed: str, env_name: str) -> tuple[str | None, str]:
    """``(token, where it came from)``: the node's field when something is typed there (it is then saved in the
    workflow and in every saved image's metadata), else ``$env_name``, else that key of ``sakura_tokens.json`` in
    ComfyUI's user folder (outside ``user/default``, so the frontend's userdata API does not serve it), else None.
    The second item names the source for messages, e.g. ``"$SAKURA_READ_TOKEN in ComfyUI's environment"``."""
    if typed.strip():
        return typed.strip(), "the token typed into the node's token field"
    if os.environ.get(env_name, "").strip():
        return os.environ[env_name].strip(), f"${env_name} in ComfyUI's environment"
    tokens, path = _user_tokens()
    token = tokens.get(env_name, "").strip()
    if token:
        logger.debug("sakura: %s read from %s", env_name, path)
        return token, f"{env_name} in {path}"
    where = path or f"ComfyUI's user/{TOKENS_FILE}"
    return None, f"no token was found (the token field, ${env_name} and {env_name} in {where} are all empty)"


def resolve_token(typed: str, env_name: str) -> str | None:
    """The token to use (see :func:`resolve_token_source`), or None."""
    return resolve_token_source(typed, env_name)[0]


def refused_token_message(what: str, source: str, env_name: str, token_field: str | None) -> str:
    """Why ``what`` answered HTTP 401 and what to do: ``source`` is :func:`resolve_token_source`'s second item;
    ``token_field`` the node field that may hold a token (None where none is read, e.g. the template chooser)."""
    if source.startswith("no token"):
        field_fix = (
            f" (or type it into the {token_field} field, which saves it in the workflow)" if token_field else ""
        )
        return (
            f"{what} requires a token (HTTP 401) and {source}: set ${env_name} in ComfyUI's environment or "
            f"{env_name} in ComfyUI's user/{TOKENS_FILE}{field_fix}"
        )
    return f"{what} refused {source} (HTTP 401): it is not the token {what} was started with; correct it there"


def image_from_comfy(image, what: str = "image") -> np.ndarray:
    """A ComfyUI ``IMAGE`` (batch, H, W, C) float in [0, 1] holding one image -> (H, W, 3) uint8."""
    shape = tuple(getattr(image, "shape", ()))
    if len(shape) != 4 or shape[-1] not in (3, 4):
        raise SakuraNodeError(f"{what}: expected a ComfyUI IMAGE (batch, height, width, 3), got shape {shape}")
    if shape[0] != 1:
        raise SakuraNodeError(f"{what}: got a batch of {shape[0]} images; the sampler edits one image per run")
    arr = image[0, ..., :3].detach().cpu().float().clamp(0, 1).numpy()  # (H, W, 3)
    return (arr * 255.0).round().astype(np.uint8)


def image_to_comfy(image: np.ndarray):
    """(H, W, 3) uint8 -> ComfyUI ``IMAGE`` (1, H, W, 3) float32 in [0, 1]."""
    import torch

    arr = np.ascontiguousarray(np.asarray(image, dtype=np.uint8)[..., :3])
    return torch.from_numpy(arr.astype(np.float32) / 255.0).unsqueeze(0)


def start_async(coro_factory: Callable[[], Coroutine[Any, Any, Any]], name: str) -> concurrent.futures.Future:
    """Run ``coro_factory()`` on a new event loop in a new daemon thread; the future holds its result."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def main() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = asyncio.run(coro_factory())
        except BaseException as e:  # handed to whoever waits on the future, which re-raises it
            future.set_exception(e)
        else:
            future.set_result(result)

    threading.Thread(target=main, name=name, daemon=True).start()
    return future


def wait_interruptible(
    future: concurrent.futures.Future, *, on_tick: Callable[[], None] | None = None, on_interrupt=None
) -> Any:
    """Wait for ``future``; every ``POLL_S`` call ``on_tick`` and check ComfyUI's interrupt flag.

    On an interrupt (or any error raised by ``on_tick``) ``on_interrupt()`` is called — it makes the work stop — the
    work is waited for, and the interrupt is re-raised so ComfyUI records the run as interrupted. Without
    ``on_interrupt`` the work (bounded by its own timeouts) finishes in its daemon thread unobserved.
    """
    import comfy.model_management

    try:
        while True:
            try:
                return future.result(timeout=POLL_S)
            except concurrent.futures.TimeoutError:
                pass
            if on_tick is not None:
                on_tick()
            comfy.model_management.throw_exception_if_processing_interrupted()
    except BaseException:
        if not future.done() and on_interrupt is not None:
            on_interrupt()
            concurrent.futures.wait([future])  # the work stops at its next check; its own error is superseded
        raise


def run_async(coro_factory: Callable[[], Coroutine[Any, Any, Any]], name: str) -> Any:
    """Run a coroutine off ComfyUI's loop and return its result (interruptible while it waits)."""
    return wait_interruptible(start_async(coro_factory, name))
