"""The key footer, without the memory it leaks in Textual as pinned.

Textual's Footer composes its keys again whenever a screen's bindings change (every
view a console opens or leaves), and each new key data-binds `compact` to the footer: a
watcher entry on the footer that Textual drops only when `compact` changes, which it
never does here. A console open all day, walked through its views, kept every key it
ever showed (20 per visit to the Events view and back, a few MiB an hour in the soak run).
"""

from __future__ import annotations

from textual import events, widgets

# Below this width the keys sit closer together, so that the last (q Quit) stays in view.
COMPACT_BELOW = 120


class Footer(widgets.Footer):
    """Textual's footer, letting go of the keys a recompose removed; compact when narrow."""

    def on_resize(self, event: events.Resize) -> None:
        compact = event.size.width < COMPACT_BELOW
        if compact != self.compact:
            self.compact = compact

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
