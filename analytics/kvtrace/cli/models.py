"""``kvtrace models``: the model and GPU presets."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from kvtrace.cli.console import console, write_json
from kvtrace.cli.errors import handles_errors
from kvtrace.cli.inputs import check_paths
from kvtrace.results import present


@handles_errors
def models(
    block_tokens: int = typer.Option(
        512, "--block-tokens", min=1, max=1 << 20, help="Block size for the bytes-per-block column."),
    json_out: Optional[str] = typer.Option(
        None, "--json", help="Write the tables as JSON to this file ('-' = stdout)."),
) -> None:
    """Model presets (KV bytes per token and per block) and GPU presets."""
    from kvtrace.model import gpus_table, models_table

    check_paths({}, None, json_out)
    mt, gt = models_table(block_tokens), gpus_table()
    if json_out:
        write_json(json_out, {"models": mt.to_dicts(), "gpus": gt.to_dicts()})
        if json_out == "-":
            return
    t = Table(title=f"model presets (bytes per block at {block_tokens} tokens)")
    heads = {"kv_bytes_per_token": "KV bytes/token", "bytes_per_block": "bytes/block", "active_params": "active params"}
    for c in mt.columns:
        t.add_column(heads.get(c, c), justify="left" if c in ("name", "attention", "dtype") else "right")
    for r in mt.iter_rows(named=True):
        t.add_row(*[f"{v / 1e9:,.1f} B" if c == "active_params" else present.count(v) if isinstance(v, (int, float))
                    else str(v) for c, v in r.items()])
    console.print(t)
    g = Table(title="GPU presets (dense BF16 peak; prices illustrative)")
    for head in ("name", "peak TFLOP/s", "MFU", "effective TFLOP/s", "$/GPU-hour"):
        g.add_column(head, justify="left" if head == "name" else "right")
    for r in gt.iter_rows(named=True):
        g.add_row(r["name"], f"{r['peak_flops'] / 1e12:,.0f}", f"{r['mfu']:g}", f"{r['effective_flops'] / 1e12:,.1f}",
                  f"${r['dollars_per_hour']:,.2f}")
    console.print(g)
