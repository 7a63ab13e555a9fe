"""Stand-in for ``comfy.utils``: ``ProgressBar`` reporting through a process-wide hook, as ComfyUI's does."""

PROGRESS_BAR_HOOK = None


def set_progress_bar_global_hook(function) -> None:
    global PROGRESS_BAR_HOOK
    PROGRESS_BAR_HOOK = function


class ProgressBar:
    def __init__(self, total, node_id=None):
        self.total = total
        self.current = 0
        self.node_id = node_id
        self.hook = PROGRESS_BAR_HOOK

    def update_absolute(self, value, total=None, preview=None):
        if total is not None:
            self.total = total
        self.current = min(value, self.total)
        if self.hook is not None:
            self.hook(self.current, self.total, preview, node_id=self.node_id)

    def update(self, value):
        self.update_absolute(self.current + value)
