"""The README's performance table, from the figures the benchmark scripts recorded.

Each script (``make bench`` runs them) records its latest figures in
``benchmarks/results.json`` (:func:`common.record`); this prints them as one Markdown
table, a row per figure with the command that reproduces it, in the order of
:data:`ORDER` (then any other script). Paste it into README.md's Performance section::

    python benchmarks/table.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS  # noqa: E402

ORDER = ("ingest.py", "curve.py", "e2e.py", "engine.py", "whatif.py", "load.py", "scenario.py", "hashing.py", "app.py")


def table(results: dict) -> str:
    """The Markdown table of ``results`` (the layout of :data:`common.RESULTS`)."""
    scripts = [s for s in ORDER if s in results] + sorted(set(results) - set(ORDER))
    lines = ["| figure | measured | target | reproduce |", "|---|--:|--:|---|"]
    for script in scripts:
        command = results[script]["command"]
        for figure, measured, target in results[script]["rows"]:
            cells = (figure, measured, target, f"`{command}`")
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def main() -> int:
    print(table(json.loads(RESULTS.read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
