"""Create-only PUTs on an S3 store: ``If-None-Match: *`` (RFC 9110 13.1.2), which makes publishing a template id
without ``--overwrite`` atomic: of any number of concurrent publishers exactly one PUT creates the manifest, the
others get 412 (``ObjectExistsError``) and readers only ever see the winner's manifest.

AWS S3 honours the header, and so does Ceph's radosgw (16.2.15: a second create-only PUT of a key is 412 and leaves
the first body; of racing writers exactly one wins, tested in ``tests/cloud_server/test_s3_exclusive_publish.py``). A
server that ignores it would let a later PUT replace the object silently, so the first create-only PUT of a store
instance probes it (create a probe key twice, expect 412, delete it); a server that fails the probe falls back to
check-then-put with one warning saying publishing is not atomic there.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable

from sakura_core.fetch.store_layout import MANIFEST_FILE

from .store import ManifestExistsError

__all__ = ["ObjectExistsError", "conditional_put_honoured", "create_only_manifest"]

logger = logging.getLogger(__name__)

#: Where the probe object lives, under the store's prefix (deleted right after).
PROBE_DIR = ".sakura-probe"


class ObjectExistsError(Exception):
    """A create-only PUT found the key already there (412 Precondition Failed)."""


def conditional_put_honoured(store) -> bool:
    """Whether ``store`` (an ``S3Store``) refuses a second create-only PUT of a key; probed with one probe key."""
    key = store.key(f"{PROBE_DIR}/{uuid.uuid4().hex}")
    try:
        store.put_object(key, b"1", if_none_match=True)
        try:
            store.put_object(key, b"2", if_none_match=True)
        except ObjectExistsError:
            return True
        logger.warning(
            "%s: the S3 server ignores If-None-Match on PUT: publishing a template id is check-then-put "
            "there, not atomic (two concurrent publishers of one id may both succeed)",
            store,
        )
        return False
    finally:
        store.delete_object(key)


def create_only_manifest(store, template_id: str, manifest: dict, fallback: Callable[[str, dict], None]) -> None:
    """``store.put_new_manifest``: the manifest PUT create-only, so of concurrent publishers of one id exactly one
    creates it and the rest get ``ManifestExistsError``; ``fallback`` (check-then-put) where the server ignores the
    header (probed once per store instance, kept in ``store.create_only``)."""
    if store.create_only is None:
        store.create_only = conditional_put_honoured(store)
    if not store.create_only:
        return fallback(template_id, manifest)
    data = (json.dumps(manifest, indent=1, sort_keys=False) + "\n").encode()
    try:
        store.put_object(store.template_key(template_id, MANIFEST_FILE), data, "application/json", if_none_match=True)
    except ObjectExistsError as e:
        raise ManifestExistsError(f"template {template_id!r} is already published in {store}") from e
