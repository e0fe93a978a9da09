"""The Textual console: fleet, node, GPU, topology, SM map and events views."""
