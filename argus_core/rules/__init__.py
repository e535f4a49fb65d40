"""Prometheus recording rules, alerts, promtool tests and Alertmanager routing, generated."""
