"""Labels that say exactly what they show (issue 18): warnings for what a run cannot do
as asked, and sizes written back with their units."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kvtrace.cli import app

ROOT = Path(__file__).resolve().parent.parent
CHAT = ROOT / "sample_traces" / "chat.jsonl"  # Mooncake: no session ids
MIXED = ROOT / "sample_traces" / "mixed.parquet"  # sessions
RUNNER = CliRunner()


def run(*args):
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def test_session_routing_without_session_ids_warns_once_and_says_what_it_did():
    res = run("whatif", CHAT, "--dram", "1GiB", "--nodes", "2", "--policy", "all,second-hit", "--flash", "1TiB",
              "--json", "-")
    assert res.exit_code == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if "--routing session" in line]
    assert warnings == [f"kvtrace: warning: {CHAT}: --routing session: the trace has no session ids, so each "
                        "request is routed by a hash of its own id (a session's turns land on any node, as with "
                        "random routing); --routing prefix keeps requests that share a first block on one node"]
    assert len(json.loads(res.stdout)["configs"]) == 2


def test_no_warning_where_it_does_not_apply():
    for args in ((MIXED, "--dram", "1GiB", "--nodes", "2"), (CHAT, "--dram", "1GiB"),
                 (CHAT, "--dram", "1GiB", "--nodes", "2", "--routing", "round-robin")):
        res = run("whatif", *args, "--json", "-")
        assert res.exit_code == 0 and "warning" not in res.stderr, res.stderr
