"""Transport only: bandwidth traces (Pensieve, Sabre, Mahimahi), link shaping (an in-process token bucket;
kernel netns + tbf is a tool: :mod:`sakura_tools.infra.netns`), and the shard client (manifests, shards with Range
resume and digest checks). Which shard to fetch is :mod:`sakura_core.policy`'s business."""

__all__: list[str] = []
