"""The demo model's world: the procedural template-editing task (:mod:`.edit_task`) and the served half of
``sakura demo`` (:mod:`.served`); its training and evaluation are tools (:mod:`sakura_tools.train`). Nothing else in
the product depends on it."""

__all__: list[str] = []
