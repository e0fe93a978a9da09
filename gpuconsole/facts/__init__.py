"""Facts every consumer derives the same way from a snapshot: ownership, inventory,
the GPU-NIC pairing, summaries."""
