"""How every benchmark prints its result: one JSON object with --json, else aligned lines."""

from __future__ import annotations

import json


def report(result: dict, as_json: bool) -> None:
    """Print ``result`` as one JSON line, or one ``key: value`` line per field."""
    if as_json:
        print(json.dumps(result))
        return
    width = max(map(len, result), default=0)
    for key, value in result.items():
        shown = f"{value:,.4g}" if isinstance(value, float) else f"{value}"
        print(f"{key:>{width}}: {shown}")
