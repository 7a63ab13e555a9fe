"""Transport only: bandwidth traces (Pensieve, Sabre, Mahimahi), link shaping (in-process token bucket and kernel
netns + tbf), and the shard client (manifests, shards with Range resume and digest checks). Which shard to fetch is
:mod:`sakura_core.policy`'s business."""

__all__: list[str] = []
