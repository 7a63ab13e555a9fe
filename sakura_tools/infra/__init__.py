"""Cloud benchmarks and the test infrastructure they start: ``bench_*`` (the ``sakura bench`` commands on the server
side), ``nginx`` (the CDN stand-in), ``radosgw`` (a real S3 server: Ceph on 127.0.0.1), ``loadgen`` and
``random_shards`` (load and its shards), ``netns`` (kernel link shaping in network namespaces)."""

__all__: list[str] = []
