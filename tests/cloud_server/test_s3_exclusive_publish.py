"""Publishing one template id on an S3 store without ``--overwrite`` is atomic (issue 28): the manifest PUT carries
``If-None-Match: *``, which radosgw honours (412 for every writer but the first), so of 8 racing publishers (each
its own ``S3Store``, as replicas are) exactly one wins, the others get ``TemplateExistsError``, and a reader polling
the manifest meanwhile only ever sees the winner's. On main (check-then-put) several writers "won" and the stored
manifest was the last one's. A server that ignores the header is detected and gets the old check-then-put, with
a warning."""

from __future__ import annotations

import json
import logging
import threading

import numpy as np
import pytest

from cloud_server.precompute import TemplateExistsError, publish_template
from cloud_server.s3_store import S3Store

from ..synthetic_templates import SyntheticModel, synthetic_precompute
from .conftest import MODEL_ID, new_s3_store

WRITERS = 8


def _race(stores: list[S3Store], template_id: str) -> tuple[list[str], set[int]]:
    """Every store publishes ``template_id`` at once (all computed first, then all publish); (outcomes, writers a
    reader saw in the manifest while they raced)."""
    computed = threading.Barrier(len(stores))
    outcomes, seen, done = [None] * len(stores), set(), threading.Event()

    def precompute(model, image, tid, **kwargs):
        result = synthetic_precompute(model, image, tid, **kwargs)
        computed.wait()  # every writer is past its own "is it published?" check
        return result

    def write(i: int) -> None:
        try:
            publish_template(
                stores[i],
                SyntheticModel(MODEL_ID),
                np.full((16, 16, 3), i, np.uint8),
                template_id,
                precompute_fn=precompute,
                annotations={"writer": i},
            )
            outcomes[i] = "won"
        except TemplateExistsError:
            outcomes[i] = "refused"

    def read() -> None:
        reader = S3Store(stores[0].location, endpoint_url=stores[0].endpoint_url)
        while not done.is_set():
            if reader.has_template(template_id):
                seen.add(json.loads(reader.get_manifest_bytes(template_id))["precompute"]["writer"])

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(stores))]
    watcher = threading.Thread(target=read)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    watcher.join(30)
    return outcomes, seen


def test_racing_publishers_of_one_id_exactly_one_wins(radosgw):
    base = new_s3_store(radosgw, "race")
    stores = [S3Store(base.location, endpoint_url=radosgw.endpoint_url) for _ in range(WRITERS)]
    for trial in range(3):
        template_id = f"tpl-race-{trial}"
        outcomes, seen = _race(stores, template_id)
        assert sorted(outcomes) == ["refused"] * (WRITERS - 1) + ["won"], outcomes  # main: several "won"
        winner = outcomes.index("won")
        assert json.loads(base.get_manifest_bytes(template_id))["precompute"]["writer"] == winner
        assert seen <= {winner}, (seen, winner)  # no reader ever saw a loser's manifest
    assert all(s.create_only is True for s in stores)  # radosgw honours If-None-Match: * (probed once each)
    assert not list(base.list_objects(".sakura-probe/"))  # the probes were deleted


def test_a_server_that_ignores_if_none_match_falls_back_with_a_warning(radosgw, caplog):
    store = new_s3_store(radosgw, "ignores")

    def drop_condition(request, **kwargs):  # what a server that ignores the header amounts to
        if "If-None-Match" in request.headers:
            del request.headers["If-None-Match"]

    store.client.meta.events.register("before-sign.s3.PutObject", drop_condition)
    caplog.set_level(logging.WARNING, logger="cloud_server.s3_conditional")
    try:
        manifest = {"version": 1, "template_id": "tpl-x"}
        store.put_new_manifest("tpl-x", manifest)
        assert store.create_only is False
        assert "ignores If-None-Match on PUT" in caplog.text and "not atomic" in caplog.text
        from cloud_server.store import ManifestExistsError

        with pytest.raises(ManifestExistsError):  # the check-then-put still refuses a published id
            store.put_new_manifest("tpl-x", manifest)
    finally:
        store.client.meta.events.unregister("before-sign.s3.PutObject", drop_condition)
