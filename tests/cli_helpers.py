"""Assertions shared by the tests that run kvtrace commands."""

from __future__ import annotations


def one_line_error(res, code: int, *needles: str) -> str:
    """The command failed cleanly: exit ``code``, one ``kvtrace: error:`` line, no traceback.

    Run with an 80-column terminal (``columns=80``) so that a wrapped message shows.
    """
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr, res.exception)
    assert isinstance(res.exception, SystemExit), res.exception  # handled, not propagated
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("kvtrace: error: "), lines[0]
    assert "Traceback" not in res.stderr + res.stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
