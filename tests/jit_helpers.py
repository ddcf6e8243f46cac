"""Running a snippet with and without the JIT (``NUMBA_DISABLE_JIT``), for the tests
that compare a kernel's Python run (which coverage sees) with its compiled one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def json_with_and_without_jit(code: str) -> tuple:
    """The JSON ``code`` prints, run as Python (JIT off) and compiled (JIT on, no on-disk
    cache), from the repository root."""
    runs = []
    for disable in ("1", "0"):
        env = {**os.environ, "NUMBA_DISABLE_JIT": disable, "KVTRACE_NUMBA_CACHE": "0"}
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                             cwd=ROOT, check=False)
        assert res.returncode == 0, res.stderr[-2000:]
        runs.append(json.loads(res.stdout))
    return runs[0], runs[1]
