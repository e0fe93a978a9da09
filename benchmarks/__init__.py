"""`make bench`: speed and memory figures, printed (medians, ratios from one run)."""
