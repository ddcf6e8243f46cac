"""The sidebar every page draws: trace source, reading options, model, GPU, LRU model.

Widget values live in Session State: ``kv_*`` for the sidebar, ``curve_*``, ``wi_*``,
``sz_*`` and ``sz.*`` (the sizing config's keys) for the pages. Streamlit forgets the value of a widget that a run does
not draw, and a page switch is such a run, so every run first writes all of them back
(``_keep``); the widgets then take their values from Session State (no
``index``/``value`` arguments, which would conflict). An uploaded file cannot be
written back like that; its bytes are kept under ``_kv_uploaded`` instead, set by the
uploader's change callback only, so a page switch keeps it and removing the file
drops it.

A server path is read only under the data directory and up to the size limit that
``kvtrace app`` passed (:func:`kvtrace.app.sources.server_path`); the sidebar states both.
A request log (format ``tokens`` or ``openai``) shows the commands' request-log options
(``kv_log_<option>``); a chat log's tokenizer and template are paths under the same
data directory (:func:`kvtrace.app.sources.log_options_from_form`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from kvtrace.analyses.distances import normalise_eviction
from kvtrace.errors import KvtraceError
from kvtrace.ingest import FORMATS, LOG_FORMATS
from kvtrace.model import DEFAULT_GPU, DEFAULT_MODEL, GPUS, MODELS, GpuSpec, ModelSpec, resolve_gpu, resolve_model
from kvtrace.trace import Trace
from kvtrace.units import format_bytes

from kvtrace.app import cached, launcher, sources

SOURCES = ("bundled sample", "upload", "server path")
EVICTIONS = ("prefix-aware", "flat")
FORMAT_LABELS = {"tokens": "tokens (token-id request log)", "openai": "openai (chat / completions requests)"}
#: request-log option -> (label, help) of its widget; the option's name is the command's (--tokens-field ...)
LOG_WIDGETS = {
    "tokenizer": ("Tokenizer (--tokenizer)", "A local Hugging Face tokenizer under the data directory (a relative "
                  "path is relative to it): a directory holding tokenizer.json and tokenizer_config.json, or the "
                  "tokenizer.json file. Nothing is downloaded."),
    "chat_template": ("Chat template (--chat-template, optional)", "A Jinja file under the data directory used "
                      "instead of the tokenizer's template."),
    "tokens_field": ("Tokens field (--tokens-field)", "The field of the prompt's token ids."),
    "time_field": ("Time field (--time-field)", "The arrival time field: seconds, ms or ISO-8601."),
    "salt_field": ("Cache-salt field (--salt-field)", "vLLM hashes the cache salt into the first block."),
    "lora_field": ("LoRA field (--lora-field)", "The LoRA adapter name: part of vLLM's block hashes."),
    "time_unit": ("Time unit (--time-unit)", "auto: detected from the values and stated on the Overview page."),
    "hash_fn": ("Hash function (--hash)", "vLLM's prefix-cache hash: sha256 (vLLM's default) or sha256_cbor."),
    "hash_seed": ("Hash seed (--hash-seed)", "The PYTHONHASHSEED vLLM ran with (it seeds the first block's "
                  "parent hash)."),
}


@dataclass
class Context:
    """What a page needs: the trace, its cache key and the shared selections."""

    trace: Trace
    key: str
    label: str
    model_name: str
    gpu_name: str
    eviction: str

    @property
    def model(self) -> ModelSpec:
        return resolve_model(self.model_name)

    @property
    def gpu(self) -> GpuSpec:
        return resolve_gpu(self.gpu_name)


def _defaults() -> dict:
    launch_path, launch_opts = launcher.launch_options()
    samples = list(launcher.sample_traces())
    return {
        "kv_source": "server path" if launch_path else "bundled sample",
        "kv_sample": samples[0] if samples else None,
        "kv_path": str(launch_path) if launch_path else "",
        "kv_fmt": launch_opts.fmt,
        "kv_block_tokens": launch_opts.block_tokens or 0,
        "kv_share": launch_opts.share_tenants,
        **{f"kv_log_{k}": v for k, v in sources.log_form_values(launch_opts.log).items()},
        "kv_model": DEFAULT_MODEL,
        "kv_gpu": DEFAULT_GPU,
        "kv_eviction": "prefix-aware",
    }


PERSISTED = ("kv_", "curve_", "wi_", "sz.", "sz_")  # widget keys kept across page switches
NOT_SETTABLE = {"kv_upload", "sz_upload"}  # file uploaders: Session State cannot set them


def _keep() -> None:
    state = st.session_state
    for k in list(state.keys()):
        if k.startswith(PERSISTED) and k not in NOT_SETTABLE:
            state[k] = state[k]
    for k, v in _defaults().items():
        if k not in state:
            state[k] = v


def _remember_upload() -> None:
    f = st.session_state.get("kv_upload")
    if f is None:
        st.session_state.pop("_kv_uploaded", None)
    else:
        data = f.getvalue()
        st.session_state["_kv_uploaded"] = (f.name, data, sources.bytes_sha256(data))


def _options() -> sources.LoadOptions:
    """The reading options chosen; raises KvtraceError for a tokenizer or template the
    page may not read."""
    s = st.session_state
    fmt = s["kv_fmt"]
    values = {k: s[f"kv_log_{k}"] for fields in sources.LOG_FIELDS.values() for k in fields}
    log = sources.log_options_from_form(fmt, values, launcher.data_dir(), max_bytes=launcher.max_trace_bytes(),
                                        base=launcher.launch_options()[1].log)
    return sources.LoadOptions(fmt=fmt, block_tokens=int(s["kv_block_tokens"]) or None,
                               share_tenants=bool(s["kv_share"]), log=log)


def _log_fields(fmt: str) -> None:
    """The request-log options a ``fmt`` log is read with (:data:`kvtrace.app.sources.LOG_FIELDS`)."""
    for name in sources.LOG_FIELDS[fmt]:
        text, help_text = LOG_WIDGETS[name]
        if name in sources.LOG_CHOICES:
            st.selectbox(text, sources.LOG_CHOICES[name], key=f"kv_log_{name}", help=help_text)
        else:
            st.text_input(text, key=f"kv_log_{name}", help=help_text)


def _load(source: str, options: sources.LoadOptions) -> sources.Loaded | None:
    s = st.session_state
    if source == "bundled sample":
        samples = launcher.sample_traces()
        if not samples:
            return sources.Loaded(None, "", "", f"no sample traces in {launcher.sample_dir()}")
        path = samples.get(s["kv_sample"]) or next(iter(samples.values()))
        return _load_path(path.name, options, launcher.sample_dir())
    if source == "upload":
        if s.get("_kv_uploaded") is None and s.get("kv_upload") is not None:
            _remember_upload()
        up = s.get("_kv_uploaded")
        if up is None:
            return None
        name, data, digest = up
        loaded = cached.trace_from_upload(sources.trace_key(digest, options), _name=name, _data=data,
                                          _options=options, _max_bytes=launcher.max_trace_bytes())
        return loaded.renamed(name, name)
    text = s["kv_path"].strip()
    if not text:
        return None
    return _load_path(text, options, launcher.data_dir())


def _load_path(text: str, options: sources.LoadOptions, root) -> sources.Loaded:
    """A path under ``root``, checked (:func:`kvtrace.app.sources.server_path`) before anything is read."""
    limit = launcher.max_trace_bytes()
    try:
        p = sources.server_path(text, root, max_bytes=limit)
        path, size, mtime = sources.file_signature(p)
        digest = cached.file_digest(path, size, mtime, limit)
    except (KvtraceError, OSError) as exc:
        return sources.Loaded(None, "", Path(text).name, sources.error_line(exc, text), text)
    loaded = cached.trace_from_file(sources.trace_key(digest, options), _path=path, _options=options)
    return loaded.renamed(p.name, text)  # cached per content: it may have been read under another name


def trace_context() -> Context:
    """Draw the sidebar and return the selected trace; stops the page (after a
    one-line error or a prompt) when there is no readable trace."""
    _keep()
    sb = st.sidebar
    sb.radio("Trace source", SOURCES, key="kv_source", horizontal=True)
    source = st.session_state["kv_source"]
    if source == "bundled sample":
        sb.selectbox("Sample trace", list(launcher.sample_traces()), key="kv_sample",
                     help=f"Synthetic traces bundled in {launcher.sample_dir()} (made by kvtrace synth).")
    elif source == "upload":
        limit = launcher.max_trace_bytes()
        sb.file_uploader("Trace file (JSONL, Parquet or CSV)", type=list(sources.UPLOAD_TYPES), key="kv_upload",
                         on_change=_remember_upload, max_upload_size=launcher.upload_limit_mb(limit),
                         help=f"Mooncake or Qwen-Bailian JSONL (.gz ok), kvtrace Parquet, a generic table, or a "
                              f"request log (format tokens or openai under Reading options); "
                              f"at most {format_bytes(limit)} (kvtrace app --max-trace-bytes).")
    else:
        root = launcher.data_dir()
        sb.text_input("Trace path on the server", key="kv_path", placeholder="conversation.jsonl",
                      help="A trace file or a directory of JSONL shards under the data directory; a relative "
                           "path is relative to it.")
        sb.caption(f"Data directory: `{root}` (kvtrace app --data-dir); at most "
                   f"{format_bytes(launcher.max_trace_bytes())} per trace (--max-trace-bytes).")
    fmt = st.session_state["kv_fmt"]
    with sb.expander("Reading options", expanded=fmt in LOG_FORMATS):
        st.selectbox("Format", FORMATS, key="kv_fmt", format_func=lambda f: FORMAT_LABELS.get(f, f),
                     help="auto detects Mooncake, Bailian, Parquet and CSV traces; a request log (tokens, openai) "
                          "is never detected: choose it.")
        st.number_input("Tokens per block (0 = the format's)", min_value=0, step=16, key="kv_block_tokens",
                        help="0: the format's own, 512 for Mooncake, 16 for Qwen-Bailian and vLLM's 16 for request "
                             "logs (tokens, openai).")
        st.checkbox("Share blocks across tenants", key="kv_share")
        if fmt in LOG_FORMATS:
            _log_fields(fmt)
    sb.divider()
    sb.selectbox("Model", list(MODELS), key="kv_model", help="Sets KV bytes per token and prefill FLOPs.")
    sb.selectbox("GPU", list(GPUS), key="kv_gpu", help="Prices the prefill compute a hit avoids.")
    sb.radio("LRU model", EVICTIONS, key="kv_eviction", horizontal=True,
             help="prefix-aware: request-atomic, radix-tree-like (default); flat: a plain block LRU.")

    try:
        options = _options()
    except KvtraceError as exc:
        st.error(sources.error_line(exc, "reading options"), icon=":material/error:")
        st.stop()
    loaded = _load(source, options)
    if loaded is None:
        st.info("Choose a trace in the sidebar: upload a file or give a path on the server.")
        st.stop()
    if loaded.error:
        st.error(loaded.error, icon=":material/error:")
        st.stop()
    model = resolve_model(st.session_state["kv_model"])
    t = loaded.trace
    sb.caption(f"**{loaded.label}**: {t.n_requests:,} requests, {t.n_accesses:,} block accesses, "
               f"{t.meta.block_tokens} tokens/block · {model.name} {model.kv_bytes_per_token:,} B/token · "
               f"key {loaded.key.split(':')[1][:12]}")
    return Context(trace=t, key=loaded.key, label=loaded.label, model_name=model.name,
                   gpu_name=st.session_state["kv_gpu"], eviction=normalise_eviction(st.session_state["kv_eviction"]))

