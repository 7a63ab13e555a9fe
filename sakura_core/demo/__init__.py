"""The demo model's world: the procedural template-editing task (:mod:`.edit_task`), its training (:mod:`.train`),
evaluation (:mod:`.evaluate`) and the served half of ``sakura demo`` (:mod:`.served`). Nothing else depends on it."""

__all__: list[str] = []
