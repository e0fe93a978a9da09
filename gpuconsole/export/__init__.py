"""Consumers that leave the process: Prometheus metrics and the agent's HTTP API."""
