"""Argus's Grafana dashboards, generated with grafana-foundation-sdk (Grafana 11.6 build).

``argus dashboards --out DIR`` writes them; the committed copies under ``grafana/dashboards``
are exactly what the generator writes (a test checks it). Never edit the JSON by hand: change
the builders (one module per dashboard), the panel helpers (:mod:`argus_grafana.panels`) or the
names and queries (:mod:`argus_grafana.queries`), and regenerate.
"""
