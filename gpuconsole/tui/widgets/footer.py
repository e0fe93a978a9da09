"""The key footer, without the memory it leaks in Textual as pinned.

Textual's Footer composes its keys again whenever a screen's bindings change (every
view a console opens or leaves), and each new key data-binds `compact` to the footer: a
watcher entry on the footer that Textual drops only when `compact` changes, which it
never does here. A console open all day, walked through its views, kept every key it
ever showed (20 per visit to the Events view and back, a few MiB an hour in the soak run).
"""

from __future__ import annotations

from textual import events, widgets
from textual.app import ComposeResult
from textual.widgets._footer import FooterKey

# Below this width the keys sit closer together, so that the last (q Quit) stays in view.
COMPACT_BELOW = 120
# When the keys still do not fit, these go first, in this order (help lists every key);
# help and quit always stay.
LEAVE_OUT = ("cycle_theme", "command_palette", "events", "back", "topology")
KEEP = ("help", "quit")


class Footer(widgets.Footer):
    """Textual's footer, letting go of the keys a recompose removed; compact when narrow,
    and when the keys do not fit even so, leaving out the ones help lists anyway."""

    def on_resize(self, event: events.Resize) -> None:
        compact = event.size.width < COMPACT_BELOW
        if compact != self.compact:
            self.compact = compact
        if event.size.width != getattr(self, "_fitted_to", None):
            self.call_later(self.recompose)

    def compose(self) -> ComposeResult:
        shown = list(super().compose())
        width = self.size.width
        self._fitted_to = width
        keys = [w for w in shown if isinstance(w, FooterKey)]
        if not width or len(keys) != len(shown):
            yield from shown  # not laid out yet, or key groups: as Textual lays them out
            return
        extra = 2 if self.compact else 3  # the padding and the gap around each key

        def room(key: FooterKey) -> int:
            return len(key.key_display) + len(key.description) + extra

        need = sum(room(k) for k in keys)
        dropped: set[int] = set()
        last_first = [k.action.rsplit(".", 1)[-1] for k in reversed(keys)]
        order = [*LEAVE_OUT, *(a for a in last_first if a not in KEEP)]
        for action in order:
            if need <= width:
                break
            for key in keys:
                if key.action.rsplit(".", 1)[-1] == action and id(key) not in dropped:
                    dropped.add(id(key))
                    need -= room(key)
        yield from (k for k in keys if id(k) not in dropped)

    async def recompose(self) -> None:
        await super().recompose()
        # `__watchers` is Textual's own attribute name (set with setattr, so not mangled)
        watchers: dict[str, list[tuple[object, object]]] = getattr(self, "__watchers", {})
        for entries in watchers.values():  # what Textual keeps when `compact` does change
            entries[:] = [
                (node, callback)
                for node, callback in entries
                if not (getattr(node, "_closing", False) or getattr(node, "_closed", False))
            ]
