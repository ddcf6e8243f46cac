"""``kvtrace sql`` reads the prompt's dot commands from a pipe too (issue 18): a script
on standard input may mix ``.tables`` / ``.schema NAME`` lines with statements, and a
bad dot command is a one-line error naming the line, like a bad statement."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtrace.cli import app

ROOT = Path(__file__).resolve().parent.parent
CHAT = ROOT / "sample_traces" / "chat.jsonl"
RUNNER = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("sqlpipe") / "chat.duckdb"
    res = RUNNER.invoke(app, ["export", str(CHAT), "--db", str(p), "--points", "20"])
    assert res.exit_code == 0, res.stderr
    return p


def sql(db: Path, stdin: str, *extra):
    return RUNNER.invoke(app, ["sql", str(db), "--format", "csv", *extra], input=stdin, env={"COLUMNS": "200"})


def test_dot_commands_from_a_pipe_run_between_statements(db):
    res = sql(db, ".tables\nselect count(*) as n\n  from requests;\n.schema knees\n")
    assert res.exit_code == 0, res.stderr
    out = res.stdout.splitlines()
    # csv output: the last result only (as for any script), here .schema knees
    assert out[0] == "column_name,data_type,comment" and out[1].startswith("metric,VARCHAR")
    res = RUNNER.invoke(app, ["sql", str(db)], input=".tables\nselect count(*) as n from requests;\n",
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "requests" in res.stdout and "4000" in res.stdout


def test_a_bad_dot_command_names_its_line(db):
    res = sql(db, "select 1 as x;\n.nope\n")
    assert res.exit_code == 1
    assert res.stderr.strip() == ("kvtrace: error: stdin:2: unknown command .nope: expected one of .tables, .schema, "
                                  ".examples, .example, .read, .help, .quit, .exit, .q")


def test_quit_stops_the_script(db):
    res = sql(db, "select 1 as x;\n.quit\nselect nonsense from nowhere;\n")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines() == ["x", "1"]


def test_a_script_without_dot_commands_is_unchanged(db):
    res = sql(db, "select 2 as y; select 3 as z;")
    assert res.exit_code == 0 and res.stdout.splitlines() == ["z", "3"]
