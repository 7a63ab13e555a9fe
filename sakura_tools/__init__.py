"""SAKURA's developer tools: what the product (the ComfyUI nodes, the server, the phone bridge and the product
commands of ``sakura``) never imports. Kept in the repository, left out of the wheel and never loaded by a ComfyUI
install:

- :mod:`sakura_tools.bench`: the benchmarks and plots (``sakura bench ...``);
- :mod:`sakura_tools.infra`: the cloud benchmarks (``sakura bench serve|catalog|store-catalog|listing``) and the
  servers and links they and the tests start (nginx CDN stand-in, Ceph radosgw, a load generator, kernel netns
  shaping);
- :mod:`sakura_tools.train`: training and evaluating the demo model (``sakura train|eval demo-model``).

It imports the product; the product never imports it: ``sakura_core/cli.py`` names these commands' modules in its
table and loads one only when it runs (``tests/test_layering.py``).
"""

__all__: list[str] = []
