"""``python -m kvtrace.cli``: the ``kvtrace`` command."""

from kvtrace.cli import main

main()
