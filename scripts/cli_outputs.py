"""Every command's outputs on the bundled samples, written to one directory to diff.

    python scripts/cli_outputs.py OUT_DIR [NAME_PREFIX ...]    # only the commands named so
    diff -r OLD_DIR NEW_DIR        # empty: the CLI's outputs are byte-identical

Each command of :data:`COMMANDS` runs in a fresh working directory; its exit code,
stdout, stderr and every file it writes land under ``OUT_DIR/<name>/``. DuckDB
databases are not byte-stable between writes, so a database is recorded as the
content of its tables (``kvtrace sql`` over each one), and elapsed times printed on
the console are masked. A refactoring that keeps
behaviour leaves ``diff -r`` empty.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
S = ROOT / "sample_traces"
CHAT, AGENT, MIXED, TOML = S / "chat.jsonl", S / "agent_bailian.jsonl", S / "mixed.parquet", S / "tiers.example.toml"

#: (name, arguments of ``kvtrace``): every command, in memory and streamed where it can be.
COMMANDS: list[tuple[str, str]] = [
    ("stats-chat", f"stats {CHAT}"),
    ("stats-chat-json", f"stats {CHAT} --json stats.json"),
    ("stats-mixed-stream", f"stats {MIXED} --stream --json stats.json"),
    ("stats-mixed", f"stats {MIXED} --json stats.json"),
    ("stats-agent", f"stats {AGENT} --model Qwen2.5-7B"),
    ("curve-chat", f"curve {CHAT} --out curve.parquet --json curve.json"),
    ("curve-chat-plot", f"curve {CHAT} --plot curve.html --distances-out d.parquet"),
    ("curve-mixed", f"curve {MIXED} --out curve.parquet --by type --warmup 10%"),
    ("curve-mixed-stream", f"curve {MIXED} --stream --out curve.parquet --by type --warmup 10%"),
    ("curve-mixed-sampled", f"curve {MIXED} --sample-rate 0.5 --out curve.parquet"),
    ("curve-mixed-sampled-stream", f"curve {MIXED} --stream --sample-rate 0.5 --out curve.parquet"),
    ("curve-agent-flat", f"curve {AGENT} --eviction flat --gpu H100 --out curve.csv"),
    ("curve-chat-capacity", f"curve {CHAT} --capacity 1GiB,8GiB,64GiB --json -"),
    ("value-chat", f"value {CHAT} --out blocks.parquet --accesses-out acc.parquet"),
    ("value-mixed", f"value {MIXED} --out blocks.parquet --json value.json"),
    ("value-mixed-stream", f"value {MIXED} --stream --out blocks.parquet --json value.json"),
    ("whatif-chat", f"whatif {CHAT} --dram 1GiB,8GiB --flash 64GiB --grid --policy all,second-hit,tinylfu --out w.parquet"),
    ("whatif-mixed", f"whatif {MIXED} --dram 2GiB --flash 32GiB --grid --policy all,value:0 --json w.json"),
    ("whatif-mixed-stream", f"whatif {MIXED} --stream --dram 2GiB --flash 32GiB --policy all,prob:0.3 --out w.parquet"),
    ("whatif-plot", f"whatif {CHAT} --dram 1GiB --flash 16GiB --plot w.html"),
    ("size-chat", f"size {CHAT} --config {TOML} --report r.md --out c.parquet"),
    ("size-mixed-html", f"size {MIXED} --config {TOML} --report r.html --json size.json"),
    ("export-mixed", f"export {MIXED} --db t.duckdb"),
    ("sql-mixed", f"sql {MIXED} --example 01_hit_rate_by_type"),
    ("sql-chat", f"sql {CHAT} -c \"select round(hit_rate_at(gib(8)), 6) as h\""),
    ("estimate-latency", "estimate latency --h-dram 0.8 --h-flash 0.15 --dram-ms 20 --flash-ms 300 "
                         "--recompute-ms 2000 --overhead-ms 20"),
    ("models", "models"),
    ("synth", "synth --kind mixed --requests 300 --seed 7 --format parquet --out s.parquet"),
    ("ingest-chat", f"ingest {CHAT} --out t.parquet"),
    ("bad-input", f"curve {S / 'README.md'}"),
]

TABLES = ["requests", "accesses", "blocks", "curve"]


def _stable(text: str) -> str:
    """Console text without what differs between identical runs: the checkout's path, elapsed times."""
    return re.sub(r"\bin \d+\.\d+ s\b", "in <elapsed> s", text.replace(str(ROOT), "<ROOT>"))


def run(name: str, args: str, out: Path) -> None:
    work = out / name
    work.mkdir(parents=True)
    kvtrace = shutil.which("kvtrace", path=str(Path(sys.executable).parent)) or "kvtrace"
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}
    p = subprocess.run([kvtrace, *shlex.split(args)], cwd=work, capture_output=True, text=True, env=env)
    (work / "_exit").write_text(f"{p.returncode}\n")
    (work / "_stdout").write_text(_stable(p.stdout))
    (work / "_stderr").write_text(_stable(p.stderr))
    for db in work.glob("*.duckdb"):
        for table in TABLES:
            q = subprocess.run([kvtrace, "sql", str(db), "-c", f"select * from {table}", "--format", "csv"],
                               cwd=work, capture_output=True, text=True, env=env)
            (work / f"{db.stem}.{table}.csv").write_text(q.stdout + q.stderr)
        db.unlink()


def main() -> None:
    out, prefixes = Path(sys.argv[1]), tuple(sys.argv[2:])
    if out.exists():
        shutil.rmtree(out)
    for name, args in COMMANDS:
        if prefixes and not name.startswith(prefixes):
            continue
        run(name, args, out)
        print(name, (out / name / "_exit").read_text().strip(), flush=True)


if __name__ == "__main__":
    main()
