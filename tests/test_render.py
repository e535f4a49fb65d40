"""The dashboard previews of docs/dashboards.md (argus_grafana.render): a matrix panel whose
query returns nothing is drawn as "No data" instead of stopping the whole rendering."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from argus_grafana.render import Renderer, Series

DEFAULTS = {"thresholds": {"steps": [{"color": "green", "value": None},
                                     {"color": "red", "value": 1.5}]}}


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_an_empty_rank_by_phase_matrix_says_no_data():
    renderer = Renderer("http://127.0.0.1:1", 0.0, 600.0, {}, set())
    fig, ax = plt.subplots()
    renderer._matrix(ax, [], "rank", "phase", "x", DEFAULTS)
    assert _texts(ax) == ["No data"]
    assert not ax.tables
    plt.close(fig)


def test_a_rank_by_phase_matrix_has_a_row_per_rank_and_a_column_per_phase():
    renderer = Renderer("http://127.0.0.1:1", 0.0, 600.0, {}, set())
    series = [Series({"rank": str(r), "phase": p}, "", [600.0], [2.5 if r == 5 else 1.0])
              for r in (10, 5, 2) for p in ("mlp", "attention")]
    fig, ax = plt.subplots()
    renderer._matrix(ax, series, "rank", "phase", "x", DEFAULTS)
    (table,) = ax.tables
    cells = table.get_celld()
    rows = sorted({r for r, _ in cells if r > 0})
    assert len(rows) == 3  # ranks 2, 5, 10, numerically ordered
    assert [cells[r, -1].get_text().get_text() for r in rows] == ["rank 2", "rank 5", "rank 10"]
    assert [cells[0, c].get_text().get_text() for c in (0, 1)] == ["attention", "mlp"]
    plt.close(fig)
