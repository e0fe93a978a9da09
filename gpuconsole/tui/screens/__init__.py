"""One module per view."""
