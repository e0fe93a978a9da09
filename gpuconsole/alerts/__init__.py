"""Alerts: rules over the exporter's own series, evaluated in-process, delivered to
Alertmanager or a webhook, and printed as Prometheus alerting rules."""
