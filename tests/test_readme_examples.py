"""The README's shell examples run as printed (issue 18): a line a shell would break
(``--policy all,value>=0`` is a redirection that creates the file ``=0``) fails here.

Every command of a ```` ```sh ```` block (continuation lines joined, comments dropped) is
either a *synopsis* (it has ``[`` option groups or upper-case placeholders such as
``TRACE``: a form to read, not to paste) or an *example*. Every example is
1. given to ``bash -c`` with its program replaced by ``printf '%s\\0'``, in an empty
   directory: the words bash passes must be exactly the words as written (no
   redirection, glob, expansion or pipe), and nothing may appear in the directory;
   (so is the head of every synopsis, the words before its first ``[...]`` group,
   which is what a reader pastes);
2. run for real through ``bash -c`` when it needs nothing this machine lacks (a Dask
   cluster, a package index, a terminal): in a scratch directory holding the bundled
   samples, in README order, exit status 0.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PLACEHOLDER = re.compile(r"\b(TRACE|TRACE_OR_DB|FILE|DIR|QUERY|NAME|OUT|SIZE|HOST|PORT|M|N|P)\b")


def commands() -> list[str]:
    out = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def _words(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=False)
    lex.whitespace_split = True
    lex.commenters = "#"
    return list(lex)


def is_synopsis(line: str) -> bool:
    return "[" in line or bool(PLACEHOLDER.search(line.split("#", 1)[0]))


EXAMPLES = [c for c in commands() if not is_synopsis(c)]
#: what a reader pastes from a synopsis: its words before the first [option group]
SYNOPSIS_HEADS = [c.split(" [", 1)[0] for c in commands() if is_synopsis(c) and not c.startswith("[")]


def runnable(line: str) -> str | None:
    """Why an example cannot run here, or None."""
    words = _words(line)
    if words[0] in ("make",):
        return "the README's own two commands, run by CI itself"
    if words[0] in ("pip", "dask"):
        return "needs a package index or a Dask cluster"
    if "--scheduler" in words or "--engine" in words:
        return "needs a Dask cluster"
    if words[:2] == ["kvtrace", "sql"] and not {"-c", "--command", "-f", "--file", "-e", "--example"} & set(words):
        return "opens an interactive prompt"
    missing = [w for w in words if re.search(r"\.(parquet|jsonl|duckdb|toml)$", w) and not w.startswith("-")
               and not (ROOT / w).exists() and w not in MADE]
    if missing:
        return f"uses files that are not bundled: {missing}"
    return None


#: files that an earlier example of the README makes
MADE = {"mixed.duckdb"}


def test_the_readme_has_examples():
    assert len(EXAMPLES) >= 6, EXAMPLES
    assert any(runnable(c) is None for c in EXAMPLES)


@pytest.mark.parametrize("line", EXAMPLES + SYNOPSIS_HEADS)
def test_an_example_is_safe_in_a_shell(line, tmp_path):
    words = _words(line)
    empty = tmp_path / "empty"
    empty.mkdir()
    rest = line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else ""
    proc = subprocess.run(["bash", "-c", "printf '%s\\0' " + rest], cwd=empty, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    got = proc.stdout.decode().split("\0")[:-1]
    assert got == words[1:], f"bash splits {line!r} into {got}"
    assert list(empty.iterdir()) == [], f"{line!r} made {list(empty.iterdir())} (a redirection?)"


def test_the_runnable_examples_run_as_printed(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "sample_traces").symlink_to(ROOT / "sample_traces")
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "200"}
    ran = 0
    for line in EXAMPLES:
        if runnable(line) is not None:
            continue
        proc = subprocess.run(["bash", "-c", line], cwd=work, capture_output=True, text=True, env=env,
                              stdin=subprocess.DEVNULL, timeout=300)
        assert proc.returncode == 0, (line, proc.stdout[-2000:], proc.stderr[-2000:])
        ran += 1
    assert ran >= 4
    assert shutil.which("kvtrace", path=env["PATH"])
