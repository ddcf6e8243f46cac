"""Request logs in the dashboard: ``kvtrace app LOG --format tokens|openai`` and the
sidebar's request-log options give the figures the commands give (the library's
:func:`kvtrace.ingest.load_trace` with the same :class:`kvtrace.ingest.LogOptions`).

A chat log's tokenizer is trained here (``test_chat_logs._train``; nothing is
downloaded) and, like a trace, read only under the data directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from test_app import ENTRY, TIMEOUT, charts, clean, metrics, pct, set_sidebar, table
from typer.testing import CliRunner

from kvtrace.app import launcher, sources
from kvtrace.cli import app as cli_app
from kvtrace.analyses.curves import compute_curve
from kvtrace.ingest import LogOptions, load_trace
from kvtrace.units import format_bytes

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
pytest.importorskip("tokenizers")
from test_chat_logs import CONVERSATION, _train  # noqa: E402
from test_logs_cli import write_token_log  # noqa: E402

GiB = 2**30
TIERS = [64 * GiB, 64 * GiB + 2**40]  # the pages' default DRAM and DRAM + flash (choices.DEFAULT_TIERS)
#: the token log's field names, none of them the defaults (prompt_token_ids, timestamp, cache_salt)
TOKEN_OPTIONS = {"tokens_field": "ids", "time_field": "ts_ms", "salt_field": "salt"}
NO_TOKENIZER = "a local Hugging Face tokenizer; nothing is downloaded"


@pytest.fixture(autouse=True)
def data(monkeypatch, tmp_path) -> Path:
    """As ``streamlit run`` does, without a launch trace; the data directory ``tmp_path/data``."""
    monkeypatch.syspath_prepend(str(ENTRY.parent))
    for k in [k for k in os.environ if k.startswith("KVTRACE_APP_")] + [launcher.ENV_SAMPLES]:
        monkeypatch.delenv(k, raising=False)
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv(launcher.ENV_DATA_DIR, str(root))
    return root


@pytest.fixture
def token_log(data) -> Path:
    """400 requests of 25 conversations (:func:`test_logs_cli.write_token_log`)."""
    return write_token_log(data / "log.jsonl", 400, 25, seed=7, step_ms=1500)


@pytest.fixture
def chat_log(data) -> Path:
    """Three turns of one conversation (each turn's prompt holds the previous one's)."""
    turn2 = CONVERSATION[:2] + [{"role": "assistant", "content": "It is sunny and warm in Paris today."},
                                {"role": "user", "content": "And in London?"}]
    turns = [CONVERSATION[:2], turn2, turn2 + [{"role": "assistant", "content": "Cold rain."},
                                               {"role": "user", "content": "Thanks"}]]
    p = data / "chat.jsonl"
    p.write_text("".join(json.dumps({"timestamp": 1_700_000_000 + 30 * i, "body": {"model": "m", "messages": m}})
                         + "\n" for i, m in enumerate(turns)))
    return p


def launched(monkeypatch, trace: Path, options: sources.LoadOptions, **kw) -> AppTest:
    """The Overview page as ``kvtrace app TRACE`` serves it (its environment, from
    :func:`kvtrace.app.launcher.streamlit_command`)."""
    _argv, env = launcher.streamlit_command(trace, options=options, **kw)
    for k, v in env.items():
        if k.startswith("KVTRACE_APP_"):
            monkeypatch.setenv(k, v)
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT).run()
    clean(at)
    return at


def opened(path: str, fmt: str, block_tokens: int = 0, **log: str) -> AppTest:
    """The Overview page on the server path ``path`` read as ``fmt`` with request-log options ``log``."""
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT)
    at.session_state["kv_source"] = "server path"
    at.session_state["kv_path"] = path
    at.session_state["kv_fmt"] = fmt
    at.session_state["kv_block_tokens"] = block_tokens
    for k, v in log.items():
        at.session_state[f"kv_log_{k}"] = v
    at.run()
    clean(at)
    return at


def widget(at: AppTest, key: str):
    return next(w for kind in ("selectbox", "text_input", "number_input") for w in getattr(at.sidebar, kind)
                if w.key == key)


def one_line(at: AppTest) -> str:
    assert len(at.error) == 1, [e.value for e in at.error]
    assert not at.metric  # nothing was shown as if read
    msg = at.error[0].value
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def assert_curves_page_is(at: AppTest, trace) -> None:
    """The Curves page's cards, tier rows and line are the library's curve of ``trace``."""
    at.switch_page("views/curves.py").run()
    clean(at)
    ref = compute_curve(trace, capacities=TIERS)
    m = metrics(at)
    assert m["ceiling (prefix tokens)"] == pct(ref.ceiling["prefix_token_hit_rate"])
    assert m["capacity to reach the ceiling"] == format_bytes(ref.ceiling["capacity_bytes"])
    tiers = table(at, "tier")
    assert tiers["prefix tokens"].to_list() == [pct(x) for x in ref.curve["prefix_token_hit_rate"]]
    assert tiers["requests"].to_list() == [pct(x) for x in ref.curve["request_hit_rate"]]
    full = compute_curve(trace)
    line = charts(at)[0][0]
    np.testing.assert_allclose(line.column("rate").to_numpy(),
                               full.curve.filter(pl.col("capacity_bytes") > 0)["prefix_token_hit_rate"].to_numpy())
    assert ref.ceiling["prefix_token_hit_rate"] > 0  # the log's blocks are reused: the curve is not flat at 0


# --------------------------------------------------------------------------- token logs


def test_kvtrace_app_on_a_token_log_shows_the_librarys_curve(monkeypatch, token_log):
    log = LogOptions.from_options(**TOKEN_OPTIONS)
    at = launched(monkeypatch, token_log, sources.LoadOptions("tokens", log=log))
    trace = load_trace(token_log, fmt="tokens", log=log)
    m = metrics(at)
    assert m["requests"] == "400" and m["block accesses"] == f"{trace.n_accesses:,}"
    assert m["distinct blocks"] == f"{trace.n_blocks:,}"
    assert any("timestamps read as milliseconds" in w.value for w in at.warning)  # the log's time note
    # the sidebar shows what the log is read with
    assert widget(at, "kv_fmt").value == "tokens"
    assert {k: widget(at, f"kv_log_{k}").value for k in TOKEN_OPTIONS} == TOKEN_OPTIONS
    assert widget(at, "kv_log_hash_fn").value == "sha256" and widget(at, "kv_log_time_unit").value == "auto"
    assert not any(w.key in ("kv_log_tokenizer", "kv_log_chat_template") for w in at.sidebar.text_input)
    assert trace.meta.block_tokens == 16 and "16 tokens/block" in at.sidebar.caption[-1].value  # vLLM's default
    assert_curves_page_is(at, trace)


def test_the_sidebars_log_options_read_a_token_log(token_log):
    at = opened("log.jsonl", "tokens")
    msg = one_line(at)  # the default field names are not this log's
    assert msg.startswith("log.jsonl") and "prompt_token_ids" in msg
    for k, v in TOKEN_OPTIONS.items():
        set_sidebar(at, f"kv_log_{k}", v)
    trace = load_trace(token_log, fmt="tokens", log=LogOptions.from_options(**TOKEN_OPTIONS))
    assert not at.error
    assert metrics(at)["block accesses"] == f"{trace.n_accesses:,}"
    key = at.sidebar.caption[-1].value
    # another hash seed: other block ids (another cache key), the same reuse
    set_sidebar(at, "kv_log_hash_seed", "42")
    seeded = load_trace(token_log, fmt="tokens", log=LogOptions.from_options(**TOKEN_OPTIONS, hash_seed="42"))
    assert seeded.requests["block_ids"].to_list() != trace.requests["block_ids"].to_list()
    assert metrics(at)["distinct blocks"] == f"{seeded.n_blocks:,}" == f"{trace.n_blocks:,}"
    # 32 tokens per block: the library's 32-token blocks
    set_sidebar(at, "kv_block_tokens", 32)
    coarse = load_trace(token_log, fmt="tokens", block_tokens=32,
                        log=LogOptions.from_options(**TOKEN_OPTIONS, hash_seed="42"))
    assert metrics(at)["block accesses"] == f"{coarse.n_accesses:,}" != f"{trace.n_accesses:,}"
    assert "32 tokens/block" in at.sidebar.caption[-1].value and at.sidebar.caption[-1].value != key
    set_sidebar(at, "kv_log_hash_fn", "sha256_cbor")
    set_sidebar(at, "kv_log_time_unit", "ms")
    assert not at.error and metrics(at)["block accesses"] == f"{coarse.n_accesses:,}"


def test_an_uploaded_token_log_is_read_with_the_log_options(token_log):
    at = opened("", "tokens", **TOKEN_OPTIONS)
    set_sidebar(at, "kv_source", "upload")
    at.sidebar.file_uploader[0].set_value(("mine.jsonl", token_log.read_bytes(), "application/octet-stream"))
    at.run()
    clean(at)
    trace = load_trace(token_log, fmt="tokens", log=LogOptions.from_options(**TOKEN_OPTIONS))
    assert metrics(at)["block accesses"] == f"{trace.n_accesses:,}"


# --------------------------------------------------------------------------- chat logs


def test_a_chat_log_with_a_tokenizer_through_the_sidebar(data, chat_log):
    tok, _ = _train(data)  # data/tok: tokenizer.json + tokenizer_config.json
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT).run()
    clean(at)
    set_sidebar(at, "kv_source", "server path")
    set_sidebar(at, "kv_path", "chat.jsonl")
    set_sidebar(at, "kv_fmt", "openai")
    assert widget(at, "kv_log_tokenizer").value == ""
    assert not any(w.key == "kv_log_tokens_field" for w in at.sidebar.text_input)  # a token log's options only
    set_sidebar(at, "kv_log_tokenizer", "tok")
    set_sidebar(at, "kv_block_tokens", 4)
    trace = load_trace(chat_log, fmt="openai", block_tokens=4, log=LogOptions(tokenizer=str(tok)))
    assert not at.error, at.error[0].value
    m = metrics(at)
    assert m["requests"] == "3" and m["block accesses"] == f"{trace.n_accesses:,}"
    assert m["distinct blocks"] == f"{trace.n_blocks:,}" != m["block accesses"]  # later turns reuse earlier blocks
    assert "4 tokens/block" in at.sidebar.caption[-1].value
    assert_curves_page_is(at, trace)

    # a chat template override, under the data directory too
    (data / "plain.jinja").write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    at.switch_page("views/overview.py").run()
    set_sidebar(at, "kv_log_chat_template", "plain.jinja")
    plain = load_trace(chat_log, fmt="openai", block_tokens=4,
                       log=LogOptions(tokenizer=str(tok), chat_template=str(data / "plain.jinja")))
    assert not at.error, at.error[0].value
    assert plain.n_accesses != trace.n_accesses
    assert metrics(at)["block accesses"] == f"{plain.n_accesses:,}"


def test_a_chat_log_without_its_tokenizer_is_one_line_naming_what_to_pass(data, chat_log):
    at = opened("chat.jsonl", "openai")
    assert one_line(at) == ("chat.jsonl: field 'tokenizer': no tokenizer: pass --tokenizer DIR_OR_tokenizer.json: "
                            f"{NO_TOKENIZER}")
    set_sidebar(at, "kv_log_tokenizer", "tokenizers/llama")
    assert one_line(at) == (f"{os.path.realpath(data)}/tokenizers/llama: no such tokenizer: "
                            f"pass --tokenizer DIR_OR_tokenizer.json: {NO_TOKENIZER}")
    (data / "empty").mkdir()
    set_sidebar(at, "kv_log_tokenizer", "empty")
    msg = one_line(at)
    assert "no tokenizer.json in this directory" in msg and NO_TOKENIZER in msg
    set_sidebar(at, "kv_log_chat_template", "missing.jinja")
    _train(data, name="tok")
    set_sidebar(at, "kv_log_tokenizer", "tok")
    assert "no such chat template file: pass --chat-template FILE" in one_line(at)


def test_a_tokenizer_outside_the_data_directory_is_refused_unread(tmp_path, data, chat_log, monkeypatch):
    import kvtrace.ingest.chat as chat

    outside, _ = _train(tmp_path, name="outside")
    reads = []
    real = chat.load_chat_tokenizer
    monkeypatch.setattr(chat, "load_chat_tokenizer", lambda *a, **k: reads.append(a) or real(*a, **k))
    root = os.path.realpath(data)
    for text in (str(outside), "../outside", "../outside/tokenizer.json"):
        msg = one_line(opened("chat.jsonl", "openai", tokenizer=text))
        assert msg == (f"{text}: field 'tokenizer': outside the data directory {root}: the dashboard reads files "
                       "under it only (kvtrace app --data-dir)")
    # a tokenizer directory inside whose tokenizer.json is a link out of it
    (data / "linked").mkdir()
    (data / "linked" / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    msg = one_line(opened("chat.jsonl", "openai", tokenizer="linked"))
    assert msg == f"linked: field 'tokenizer': tokenizer.json is outside the data directory {root}"
    msg = one_line(opened("chat.jsonl", "openai", tokenizer="linked", chat_template="../outside/tokenizer.json"))
    assert "outside the data directory" in msg
    assert reads == []


# --------------------------------------------------------------------------- kvtrace app


def test_launch_options_round_trip_through_the_environment(data, token_log, monkeypatch):
    tok, _ = _train(data)
    log = LogOptions.from_options(**TOKEN_OPTIONS, time_unit="ms", hash_fn="sha256_cbor", hash_seed="7",
                                  tokenizer=str(tok))
    _argv, env = launcher.streamlit_command(token_log, options=sources.LoadOptions("tokens", 32, log=log))
    assert json.loads(env[launcher.ENV_LOG_OPTIONS])["fields"]["tokens"] == "ids"
    for k, v in env.items():
        if k.startswith("KVTRACE_APP_"):
            monkeypatch.setenv(k, v)
    path, opts = launcher.launch_options()
    assert path == token_log and opts == sources.LoadOptions("tokens", 32, log=log)
    # default options are not passed: a trace launched without them keeps its cache key
    _argv, env = launcher.streamlit_command(token_log, options=sources.LoadOptions("tokens", log=LogOptions()))
    assert launcher.ENV_LOG_OPTIONS not in env
    # a tokenizer out of --data-dir is refused before Streamlit starts
    elsewhere = data.parent / "models"
    elsewhere.mkdir()
    from kvtrace.errors import KvtraceError

    with pytest.raises(KvtraceError, match=r"models: field 'tokenizer': outside --data-dir .* holds the trace and"):
        launcher.streamlit_command(token_log, options=sources.LoadOptions("openai", log=LogOptions(
            tokenizer=str(elsewhere))))


def test_the_cache_key_names_the_log_options(token_log):
    plain = sources.LoadOptions("tokens")
    assert plain.tag == sources.LoadOptions("tokens", log=LogOptions()).tag == "tokens/default/split"
    tags = {sources.LoadOptions("tokens", log=LogOptions.from_options(**o)).tag
            for o in ({"tokens_field": "ids"}, {"tokens_field": "ids", "hash_seed": "1"}, {"time_unit": "ms"})}
    assert len(tags) == 3 and all(t.startswith("tokens/default/split/log-") for t in tags)
    a = sources.load_file(token_log, sources.LoadOptions("tokens", log=LogOptions.from_options(**TOKEN_OPTIONS)))
    assert a.error is None and a.trace.n_requests == 400


def test_the_tokenizers_bytes_are_in_the_cache_key(data):
    tok, _ = _train(data)
    opts = sources.LoadOptions("openai", log=LogOptions(tokenizer=str(tok)))
    before = opts.tag
    config = tok / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"eos_token": "</s>"', '"eos_token": "<unk>"'))
    assert opts.tag != before


def test_the_app_command_passes_the_request_log_options(data, token_log, monkeypatch):
    seen = {}

    class FakePopen:
        def __init__(self, argv, env):
            seen["env"] = env

        def wait(self, timeout=None):
            return 0

    import subprocess

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    res = CliRunner().invoke(cli_app, ["app", str(token_log), "--format", "tokens", "--tokens-field", "ids",
                                       "--time-field", "ts_ms", "--salt-field", "salt"])
    assert res.exit_code == 0, res.output
    monkeypatch.setenv(launcher.ENV_LOG_OPTIONS, seen["env"][launcher.ENV_LOG_OPTIONS])
    monkeypatch.setenv(launcher.ENV_FORMAT, seen["env"][launcher.ENV_FORMAT])
    assert launcher.launch_options()[1].log == LogOptions.from_options(**TOKEN_OPTIONS)
