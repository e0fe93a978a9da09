"""Widgets and cell renderers shared by the console's screens."""
