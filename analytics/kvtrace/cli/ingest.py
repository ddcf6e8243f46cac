"""``kvtrace ingest`` (a trace to canonical Parquet, or an anonymised JSONL) and
``kvtrace synth`` (a synthetic trace)."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from kvtrace.cli.console import console, warn
from kvtrace.cli.errors import handles_errors
from kvtrace.cli.inputs import check_paths
from kvtrace.cli.options import (BlockTokensOpt, Fmt, FormatOpt, ShareTenantsOpt, log_options, parse_path,
                                 with_log_options)
from kvtrace.errors import UsageError


class ExportFmt(str, Enum):
    mooncake = "mooncake"
    bailian = "bailian"


class SynthKind(str, Enum):
    chat = "chat"
    agent = "agent"
    rag = "rag"
    mixed = "mixed"


class SynthFmt(str, Enum):
    mooncake = "mooncake"
    bailian = "bailian"
    parquet = "parquet"


@handles_errors
@with_log_options
def ingest(
    src: Path = typer.Argument(
        ..., parser=parse_path, help="Trace: Mooncake/Bailian JSONL (gzip/zstd ok, or a directory of shards), Parquet "
                                     "or CSV."),
    out: Path = typer.Option(..., "--out", "-o", parser=parse_path, help="Canonical Parquet to write (a .jsonl with "
                                                                           "--anonymize)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
    anonymize: bool = typer.Option(False, "--anonymize", help="Write a shareable JSONL instead: dense block ids, "
                                                              "trace-relative times, lengths; no tokens or text."),
    to: ExportFmt = typer.Option(ExportFmt.mooncake, "--to", help="The --anonymize format: mooncake or bailian."),
) -> None:
    """Convert a trace to kvtrace's canonical Parquet (request table + metadata).

    Every other command reads the source formats directly; ingest once to skip
    re-parsing large JSONL files (and hashing or tokenizing request logs).
    """
    from kvtrace.ingest import build_trace, distinct_blocks, load_requests, write_canonical

    if anonymize and out.suffix != ".jsonl":
        raise UsageError(f"--anonymize writes JSONL: name the output .jsonl, got '{out.name}'", field="out")
    check_paths({"out": out}, {"TRACE": src})
    t0 = time.perf_counter()
    log = log_options()
    if fmt.value == "tokens" and not (anonymize or log.rechain or log.reblock) and _ingest_token_log(
            src, out, block_tokens, share_tenants, log, t0):
        return
    df, meta, warnings = load_requests(src, fmt=fmt.value, block_tokens=block_tokens, share_tenants=share_tenants,
                                       workload="ingest", log=log)
    for w in warnings:
        warn(src, w)
    if anonymize:
        from kvtrace.ingest.anonymize import write_anonymized
        from kvtrace.ingest.jsonl import BAILIAN_BLOCK_TOKENS, MOONCAKE_BLOCK_TOKENS

        n = write_anonymized(build_trace(df, meta, []), out, to.value)
        native = {"mooncake": MOONCAKE_BLOCK_TOKENS, "bailian": BAILIAN_BLOCK_TOKENS}[to.value]
        again = "" if meta.block_tokens == native else f" --block-tokens {meta.block_tokens}"
        console.print(f"wrote {out}: {n:,} requests as anonymised {to.value} JSONL ({meta.block_tokens} tokens/block) "
                      f"in {time.perf_counter() - t0:.2f} s; read it back with `kvtrace curve {out.name}{again}`",
                      soft_wrap=True, markup=False)
        return
    write_canonical(df, meta, out)
    # the counts need only the dense-id table, not the access table: a lower peak of memory
    n_acc = int(df["block_ids"].list.len().sum())
    n_blocks = distinct_blocks(df, meta)
    dt = time.perf_counter() - t0
    console.print(
        f"wrote {out}: {df.height:,} requests, {n_acc:,} block accesses, "
        f"{n_blocks:,} distinct blocks ({meta.source_format}, {meta.block_tokens} tokens/block) "
        f"in {dt:.2f} s",
        soft_wrap=True,
    )


def _ingest_token_log(src: Path, out: Path, block_tokens: Optional[int], share_tenants: bool, log,
                      t0: float) -> bool:
    """Hash a token log chunk by chunk into ``out`` (memory: one chunk); False when its
    timestamps go back (then the in-memory read sorts it)."""
    import pyarrow.parquet as pq

    from kvtrace.ingest.guard import parquet_list_values
    from kvtrace.ingest.tokens import UnsortedLog, write_token_parquet
    from kvtrace.outputs import atomic_path

    spec = log.hash_spec(block_tokens)
    try:
        with atomic_path(out) as tmp:
            got = write_token_parquet(src, tmp, fields=log.fields, spec=spec, time_unit=log.time_unit,
                                      share_tenants=share_tenants)
            md = pq.read_metadata(tmp)
            rows, n_acc = md.num_rows, parquet_list_values(md)[0]  # a log's every request has >= 1 block
    except UnsortedLog:
        return False
    for w in got.notes:
        warn(src, w)
    console.print(f"wrote {out}: {rows:,} requests, {n_acc:,} block accesses (tokens, {spec.block_tokens} "
                  f"tokens/block, {spec.hash_fn}) in {time.perf_counter() - t0:.2f} s, hashed chunk by chunk",
                  soft_wrap=True, markup=False)
    return True


@handles_errors
def synth(
    kind: SynthKind = typer.Option(SynthKind.chat, "--kind", help="Workload: chat, agent, rag or mixed."),
    requests: int = typer.Option(2000, "--requests", "-n", min=1, help="Number of requests."),
    seed: int = typer.Option(0, "--seed", min=0, max=2**63 - 1, help="Random seed (same seed, same trace)."),
    out: Path = typer.Option(..., "--out", "-o", parser=parse_path, help="File to write."),
    fmt: SynthFmt = typer.Option(SynthFmt.mooncake, "--format", help="mooncake / bailian JSONL, or canonical parquet."),
    block_tokens: Optional[int] = typer.Option(
        None, "--block-tokens", min=1, max=1 << 20, help="Tokens per block (default 512; 16 for bailian)."),
    rate: Optional[float] = typer.Option(None, "--rate", min=1e-6, help="Mean session arrival rate, per second."),
    chunk_requests: Optional[int] = typer.Option(
        None, "--chunk-requests", min=1, help="Generate and write in chunks of this many requests (very large "
                                              "traces)."),
) -> None:
    """Generate a realistic synthetic trace (multi-turn chat, tool agents, RAG, shared system prompts)."""
    from kvtrace.ingest import synth as synth_mod

    check_paths({"out": out})
    t0 = time.perf_counter()
    if chunk_requests:
        synth_mod.write_chunked(kind.value, requests, seed, out, fmt.value, block_tokens=block_tokens,
                                rate_per_s=rate, chunk_requests=chunk_requests)
        console.print(f"wrote {out} ({requests:,} requests, {fmt.value}) in {time.perf_counter() - t0:.2f} s",
                      soft_wrap=True)
        return
    df, meta = synth_mod.generate(kind.value, requests, seed, block_tokens=block_tokens, rate_per_s=rate)
    synth_mod.write(df, meta, out, fmt.value)
    n_acc = int(df["block_ids"].list.len().sum())
    console.print(f"wrote {out}: {df.height:,} requests, {n_acc:,} block accesses ({kind.value}, {fmt.value}) "
                  f"in {time.perf_counter() - t0:.2f} s", soft_wrap=True)
