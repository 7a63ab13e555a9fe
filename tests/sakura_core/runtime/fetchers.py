"""In-memory blob fetchers for the live pipeline tests: instant, whole blobs or in chunks."""

import asyncio

CHUNK = 4096


def blob_fetcher(blob_of, chunks: bool = False):
    """``async (digest, nbytes) -> blob_of(digest)``; with ``chunks`` it takes ``on_chunk``, reports each 4 KiB and
    awaits the turn it returns (as ShardClient does: the lane's requests may then go ahead of the wire)."""

    async def plain(digest, nbytes):
        return blob_of(digest)

    async def chunked(digest, nbytes, on_chunk=None):
        blob = blob_of(digest)
        for i in range(0, len(blob), CHUNK):
            turn = on_chunk(len(blob[i : i + CHUNK]))
            if turn is not None:
                await turn
            await asyncio.sleep(0)
        return blob

    return chunked if chunks else plain
