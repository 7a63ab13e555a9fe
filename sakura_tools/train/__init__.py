"""The demo model's training (:mod:`.train`, its config :mod:`.train_config`) and evaluation (:mod:`.evaluate`):
``sakura train demo-model`` and ``sakura eval demo-model``. The shipped weights are in
``sakura_core/models/weights``; the product only loads them."""

__all__: list[str] = []
