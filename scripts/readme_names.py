"""Rewrite the tables of the README's "Metric names" section from kvtrace.names.

Run after changing :data:`kvtrace.names.TABLES` or :data:`kvtrace.names.ALIASES`;
``tests/test_names.py`` fails until the README matches.
"""

from __future__ import annotations

from pathlib import Path

from kvtrace import names

README = Path(__file__).resolve().parents[1] / "README.md"


def main() -> None:
    text = README.read_text(encoding="utf-8")
    start = text.index("## Metric names")
    end = text.index("\n## ", start + 5) + 1
    first = text.index("#### ", start)
    README.write_text(text[:first] + names.markdown() + "\n" + text[end:], encoding="utf-8")


if __name__ == "__main__":
    main()
