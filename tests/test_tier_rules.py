"""Engine reuse rules on the tiers (``--cache-rules vllm|sglang`` on whatif, load, size).

Layers (the kernel-vs-twin comparison under random rules is in tests/test_tiers.py):
- an independent model: where nothing is evicted, a DRAM tier under the reuse rules
  hits what SGLang's radix cache (tests/naive_sglang.py) matches with its reuse rules
  on, request by request. (With evictions they differ by design: a pool allocates a
  page for a partial tail and for the recomputed last block while a request runs,
  an offload tier does not);
- the library: ``simulate(cache_rules=...)`` is the kernel with those rule bits, and
  ``ideal`` is today's run bit for bit;
- the commands: ``kvtrace whatif``/``load`` state the rules, write them in the table,
  and a recommendation made under rules replays identically with the command it prints.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import naive_sglang as sg
from kvtrace.analyses.sizing import load_config, recommend
from kvtrace.analyses.sizing.replay import whatif_args
from kvtrace.analyses.whatif import TIER_RULE_TEXT, TIER_RULES, TierConfig, simulate, sweep, tier_rules
from kvtrace.cli import app
from kvtrace.errors import UsageError
from kvtrace.ingest import load_trace
from kvtrace.kernels import tiers as K
from kvtrace.model import resolve_model
from kvtrace.trace import Trace

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "sample_traces" / "chat.jsonl"
EXAMPLE = ROOT / "sample_traces" / "tiers.example.toml"
runner = CliRunner()
ONE_BYTE = resolve_model(kv_bytes_per_token=1)

#: SGLang with only its reuse rules on (cap, full pages) and its pool rules off
REUSE_ONLY = sg.Rules(last_token_cap=True, full_pages_only=True, reject_oversize=False, whole_leaf_eviction=False,
                      evict_amount="shortfall", reserve_page=False, split_refresh=False)


@st.composite
def conversations(draw):
    """Requests drawn from a few shared chains of full pages (a chain's j-th page has
    one id), each ending in a full page or a partial one (tokens 1..B-1, an id of its
    own per chain, length and tokens, as a hash of its tokens would be)."""
    B = draw(st.sampled_from([1, 2, 4]))
    reqs = []
    for _ in range(draw(st.integers(1, 30))):
        c = draw(st.integers(0, 3))
        n = draw(st.integers(1, 6))
        blocks, tokens = [c * 100 + j for j in range(n)], [B] * n
        tail = draw(st.integers(0, B - 1))
        if tail:
            blocks.append(10**6 + c * 10**4 + n * 10 + tail)
            tokens.append(tail)
        reqs.append((blocks, tokens))
    return B, reqs


def _tier_hits(reqs, B, rules, dram):
    ids = {b: i for i, b in enumerate(sorted({b for r, _ in reqs for b in r}))}
    size = np.zeros(len(ids), np.int64)
    for r, tk in reqs:
        for b, k in zip(r, tk):
            size[ids[b]] = max(size[ids[b]], k)
    block = np.array([ids[b] for r, _ in reqs for b in r], dtype=np.int64)
    tokens = np.array([k for _, tk in reqs for k in tk], dtype=np.int32)
    req_start = np.concatenate([[0], np.cumsum([len(r) for r, _ in reqs])]).astype(np.int64)
    pos = np.concatenate([np.arange(len(r)) for r, _ in reqs]).astype(np.int32)
    run = K.simulate_tiers(block, size, req_start, tokens, pos, np.arange(len(reqs), dtype=np.float64),
                           np.zeros(len(reqs), np.int64), block_tokens=B, prefix_aware=True, dram=dram, local=0,
                           flash=0, n_nodes=1, rules=rules)
    hits = []
    for r in range(len(reqs)):
        d = run.decision[req_start[r]:req_start[r + 1]]
        miss = np.flatnonzero(d != K.DRAM)
        hits.append(int(miss[0]) if miss.size else int(d.shape[0]))
    return hits


@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(conversations())
def test_reuse_rules_are_sglangs_where_nothing_is_evicted(case):
    """With room for everything, SGLang's pool rules (evictions, the transient pages a
    request allocates) never act, and the tier under the reuse rules hits exactly the
    pages SGLang's radix cache matches (tests/naive_sglang.py)."""
    B, reqs = case
    pages = sum(len(r) for r, _ in reqs) + 8
    as_sglang = [{"blocks": r, "tokens": tk} for r, tk in reqs]
    want = [res.hit_blocks for res in sg.replay(as_sglang, pages, B, REUSE_ONLY)]
    both = K.RULE_LAST_TOKEN_CAP | K.RULE_FULL_BLOCKS_ONLY
    assert _tier_hits(reqs, B, both, pages * B) == want
    ideal = [res.hit_blocks for res in sg.replay(as_sglang, pages, B, sg.KVTRACE_RULES)]
    assert _tier_hits(reqs, B, 0, pages * B) == ideal


def test_the_rules_differ_from_the_ideal_model_by_hand():
    full = ([0, 1], [4, 4])  # the same two-page prompt twice: the cap recomputes the last page
    assert _tier_hits([full, full], 4, 0, 100) == [0, 2]
    assert _tier_hits([full, full], 4, K.RULE_LAST_TOKEN_CAP, 100) == [0, 1]
    part = ([0, 7], [4, 2])  # a partial tail: reused by the ideal model only
    assert _tier_hits([part, part], 4, 0, 100) == [0, 2]
    assert _tier_hits([part, part], 4, K.RULE_FULL_BLOCKS_ONLY, 100) == [0, 1]


def _trace(rng: random.Random, tmp: Path) -> Trace:
    """A Mooncake-format trace of conversations (512-token blocks): each turn extends the
    previous prompt by 1-3 full blocks and ends in a partial block with its own id (a
    partial block's hash differs from the full one's)."""
    lines, tail_id, t = [], 10**6, 0
    for s in range(6):
        length = 0
        for _ in range(rng.randint(1, 5)):
            length += rng.randint(1, 3)
            tail_id += 1
            lines.append({"timestamp": t, "input_length": 512 * length + rng.randint(1, 511), "output_length": 8,
                          "hash_ids": [s * 1000 + j for j in range(length)] + [tail_id]})
            t += rng.choice([500, 2000, 30000])
    path = tmp / f"conv-{rng.random():.6f}.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return load_trace(path)


@pytest.mark.parametrize("seed", range(4))
def test_simulate_applies_the_rule_bits(seed, tmp_path):
    trace = _trace(random.Random(seed), tmp_path)
    cfg = TierConfig(dram_bytes=3 * 512, flash_bytes=6 * 512)
    a = trace.accesses
    for name, bits in TIER_RULES.items():
        got = simulate(trace, cfg, model=ONE_BYTE, cache_rules=name)
        run = K.simulate_tiers(a.block, trace.block_size, a.req_start, a.tokens, a.pos, trace.request_timestamp,
                               np.zeros(trace.n_requests, np.int64), block_tokens=512, prefix_aware=True,
                               dram=3 * 512, local=0, flash=6 * 512, n_nodes=1, rules=bits)
        assert got.summary["cache_rules"] == name and got.info["cache_rules_text"] == TIER_RULE_TEXT[name]
        assert got.info["counts"] == run.counts
    assert simulate(trace, cfg, model=ONE_BYTE).summary == simulate(trace, cfg, model=ONE_BYTE,
                                                                     cache_rules="ideal").summary
    with pytest.raises(UsageError, match="ideal, vllm or sglang"):
        tier_rules("lmcache")


def test_rules_by_hand_on_the_tiers(tmp_path):
    """With DRAM holding everything: ideal = every block an earlier request touched;
    under the rules each request's last block (here a partial tail, with an id of its
    own) is recomputed, and partial tails never occupy the tier."""
    trace = _trace(random.Random(7), tmp_path)
    big = TierConfig(dram_bytes=10**9, flash_bytes=0)
    ideal = simulate(trace, big, model=ONE_BYTE)
    vllm = simulate(trace, big, model=ONE_BYTE, cache_rules="vllm")
    assert ideal.summary["cache_rules"] == "ideal" and vllm.summary["cache_rules"] == "vllm"
    a = trace.accesses
    last = a.req_start[1:] - 1
    # by hand: with DRAM holding everything, ideal = every block seen before by an earlier request;
    # vLLM = the same minus each request's last block (a partial tail, never cached anyway)
    seen: set = set()
    want_ideal = want_vllm = 0
    for r in range(trace.n_requests):
        lo, hi = int(a.req_start[r]), int(a.req_start[r + 1])
        usable = True
        for t in range(lo, hi):
            b = int(a.block[t])
            usable = usable and b in seen
            if usable:
                want_ideal += int(a.tokens[t])
                if t != last[r]:
                    want_vllm += int(a.tokens[t])
        seen.update(int(b) for b in a.block[lo:hi])
    total = float(a.tokens.sum())
    assert ideal.summary["prefix_token_hit_rate"] == pytest.approx(want_ideal / total, rel=1e-12)
    assert vllm.summary["prefix_token_hit_rate"] == pytest.approx(want_vllm / total, rel=1e-12)
    assert vllm.summary["prefix_token_hit_rate"] <= ideal.summary["prefix_token_hit_rate"]
    # tails never reach DRAM: a DRAM of exactly the full blocks evicts nothing under the rules
    full = int(trace.block_size[trace.block_size == 512].sum())
    tight = TierConfig(dram_bytes=full, flash_bytes=0)
    assert simulate(trace, tight, model=ONE_BYTE, cache_rules="vllm").info["counts"]["evict_dram"] == 0
    assert simulate(trace, tight, model=ONE_BYTE).info["counts"]["evict_dram"] > 0


def test_sweep_carries_the_rules(tmp_path):
    trace = _trace(random.Random(3), tmp_path)
    cfgs = [TierConfig(dram_bytes=2 * 512, flash_bytes=f) for f in (0, 8 * 512)]
    table = sweep(trace, cfgs, model=ONE_BYTE, cache_rules="sglang", workers=1)
    assert table["cache_rules"].to_list() == ["sglang", "sglang"]
    one = simulate(trace, cfgs[1], model=ONE_BYTE, cache_rules="sglang").summary
    assert table.row(1, named=True)["prefix_token_hit_rate"] == one["prefix_token_hit_rate"]


# --------------------------------------------------------------------------- commands


def test_whatif_cli_states_and_writes_the_rules(tmp_path):
    out = tmp_path / "w.parquet"
    res = runner.invoke(app, ["whatif", str(CHAT), "--dram", "4GiB", "--flash", "64GiB", "--cache-rules", "vllm",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "cache rules: vLLM v1" in " ".join(res.output.split())
    t = pl.read_parquet(out)
    assert t["cache_rules"].to_list() == ["vllm"]
    lib = simulate(load_trace(CHAT), TierConfig(dram_bytes="4GiB", flash_bytes="64GiB"), cache_rules="vllm")
    assert t["prefix_token_hit_rate"][0] == lib.summary["prefix_token_hit_rate"]
    ideal = simulate(load_trace(CHAT), TierConfig(dram_bytes="4GiB", flash_bytes="64GiB"))
    assert t["prefix_token_hit_rate"][0] != ideal.summary["prefix_token_hit_rate"]
    bad = runner.invoke(app, ["whatif", str(CHAT), "--dram", "4GiB", "--cache-rules", "lmcache"])
    assert bad.exit_code != 0


def test_load_cli_states_the_rules(tmp_path):
    js = tmp_path / "l.json"
    res = runner.invoke(app, ["load", str(CHAT), "--dram", "64GiB", "--flash", "1TiB", "--load", "1x",
                              "--cache-rules", "sglang", "--json", str(js)])
    assert res.exit_code == 0, res.output
    doc = json.loads(js.read_text())
    assert doc["info"]["cache_rules"] == "sglang" and "cache rules: sglang" in doc["info"]["assumptions"]
    assert "cache rules: SGLang" in " ".join(res.output.split())
    w = simulate(load_trace(CHAT), TierConfig(dram_bytes="64GiB", flash_bytes="1TiB"), cache_rules="sglang")
    assert doc["levels"][0]["prefix_token_hit_rate"] == w.summary["prefix_token_hit_rate"]


def test_size_under_rules_replays_identically_with_its_command(tmp_path):
    cfg = dataclasses.replace(load_config(EXAMPLE), cache_rules="vllm")
    res = recommend(load_trace(CHAT), cfg, trace_name=str(CHAT))
    rec = res.recommendation
    assert res.info["cache_rules"] == "vllm"
    assert any("vllm's reuse rules" in r for r in rec.reasons)
    assert rec.replay is not None and rec.replay.cache_rules == "vllm"
    args = whatif_args(rec.replay)
    assert args[args.index("--cache-rules") + 1] == "vllm"
    js = tmp_path / "w.json"
    out = runner.invoke(app, ["whatif", *args, "--json", str(js)])
    assert out.exit_code == 0, out.output
    w = json.loads(js.read_text())["configs"][0]
    assert w["dram_prefix_token_hit_rate"] == rec.figures["dram_prefix_token_hit_rate"]
    assert w["service_time_p99_ms"] == rec.figures["service_time_p99_ms"]
    # the ideal run says how to apply the rules
    ideal = recommend(load_trace(CHAT), load_config(EXAMPLE), trace_name=str(CHAT)).recommendation
    assert any("cache_rules" in r for r in ideal.risks) and "--cache-rules" not in (ideal.whatif_command or "")


def test_size_cli_option_overrides_the_config(tmp_path):
    js = tmp_path / "s.json"
    res = runner.invoke(app, ["size", str(CHAT), "--config", str(EXAMPLE), "--cache-rules", "sglang",
                              "--json", str(js)])
    assert res.exit_code == 0, res.output
    doc = json.loads(js.read_text())
    assert doc["info"]["cache_rules"] == "sglang"
    assert "--cache-rules sglang" in doc["recommendation"]["whatif_command"]


def test_size_config_rejects_unknown_rules(tmp_path):
    p = tmp_path / "t.toml"
    text = EXAMPLE.read_text()
    assert 'cache_rules = "ideal"' in text
    p.write_text(text.replace('cache_rules = "ideal"', 'cache_rules = "lmcache"'))
    res = runner.invoke(app, ["size", str(CHAT), "--config", str(p)])
    assert res.exit_code != 0
    assert "search.cache_rules" in res.output and "ideal, vllm or sglang" in res.output
