"""OpenAI request logs (format ``openai``) -> token ids -> canonical request table.

A chat log is JSONL (plain, gzip or zstd), one request per line, in any of three forms:

- a bare chat-completions (``messages``) or completions (``prompt``) request body;
- a body wrapped with its arrival time: ``{"timestamp": ..., "body": {...}}`` (gateway
  spellings ``created`` / ``time`` / ``ts`` and ``request`` are accepted too);
- the OpenAI Batch API input file: ``{"custom_id": ..., "method": "POST", "url":
  "/v1/chat/completions", "body": {...}}``.

Chats are rendered with the tokenizer's chat template exactly as transformers'
``apply_chat_template`` renders them (:mod:`kvtrace.ingest.chat_template`) and
tokenized without adding special tokens; completions prompts (a string, a list of
strings, a token list or a list of token lists: one request each) are tokenized with
the post-processor's special tokens, as vLLM's completions endpoint does (a body's
``add_special_tokens`` is honoured in both). The token lists then go through the same
path as a token log (:mod:`kvtrace.ingest.tokens`): block ids hashed as vLLM v1's prefix
cache does, timestamps read in the same units, the same canonical table.

Fields
------
- time: the wrapper's ``timestamp`` / ``created`` / ``time`` / ``ts`` (seconds, ms, us,
  ns or ISO-8601, as for token logs). A log whose first record has none (Batch API
  files, bare bodies) gets line order, 1 s apart, and ``time_note`` says so.
- request id: the wrapper's ``request_id``, the Batch API's ``custom_id``; a
  completions body of k prompts gives ``<id>-0`` ... ``<id>-(k-1)`` (as vLLM names them).
- session id: the wrapper's ``session_id``, else the body's ``user``.
- tenant: the body's ``model`` (configurable; a different model never shares blocks).
- output tokens: a measured count (the wrapper's ``output_tokens``, or
  ``usage.completion_tokens`` of a logged response) when there is one, else the body's
  ``max_completion_tokens`` / ``max_tokens`` (an upper bound), else 0; the warnings count
  each.
- cache salt: the body's ``cache_salt`` (vLLM's request field); LoRA name: the body's
  ``model`` when ``lora_from_model`` is set (except the names in ``base_models``).

Content parts: ``{"type": "text"}`` parts are passed to the template as a list (as
transformers does); any other part (an image, audio, a file) is refused with an error:
its tokens are model-specific placeholders, and vLLM adds multimodal keys to the block
hashes, so no id computed here would match the server's.

Errors are :class:`~kvtrace.errors.KvtraceError` naming the file, the 1-based line and
the field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from itertools import chain
from typing import Iterator

import numpy as np
import polars as pl

from kvtrace.errors import KvtraceError, UsageError
from kvtrace.trace import Trace, TraceMeta
from kvtrace.ingest.chat_template import ChatTokenizer, TemplateFailure, load_chat_tokenizer
from kvtrace.ingest.tokens import TokenFields, TokenLog, open_binary, TokenLogReader, short_text
from kvtrace.ingest.vllm_hash import MAX_TOKEN_ID, HashSpec

FORMAT = "openai"
#: Request lines per chunk: rendered and tokenized together (``encode_batch``).
CHAT_CHUNK_ROWS = 2048
BATCH_URLS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
_TEXT_PARTS = ("text", "input_text")


@dataclass(frozen=True)
class ChatFields:
    """Where a chat log keeps what the canonical table needs.

    Attributes
    ----------
    time : tuple of str
        Wrapper fields tried in turn for the arrival time.
    body : tuple of str
        Wrapper fields tried in turn for the request body.
    request_id, session_id, output_tokens : str
        Wrapper fields (a bare body has none).
    user_as_session : bool
        Without a ``session_id``, take the body's ``user`` as the session.
    tenant : str or None
        Body field (else wrapper field) naming the tenant; None: no tenants.
    lora_from_model : bool
        The body's ``model`` names a LoRA adapter (hashed into every block, as vLLM does).
    base_models : tuple of str
        ``model`` values that are the base model, not an adapter.
    """

    time: tuple[str, ...] = ("timestamp", "created", "time", "ts")
    body: tuple[str, ...] = ("body", "request")
    request_id: str = "request_id"
    session_id: str = "session_id"
    output_tokens: str = "output_tokens"
    user_as_session: bool = True
    tenant: str | None = "model"
    lora_from_model: bool = False
    base_models: tuple[str, ...] = ()


_MEASURED = (("usage", "completion_tokens"), ("response", "usage", "completion_tokens"),
             ("response", "body", "usage", "completion_tokens"))


def _dig(rec: dict, keys: tuple) -> object:
    for k in keys:
        if not isinstance(rec, dict):
            return None
        rec = rec.get(k)
    return rec


def _kind(body: dict) -> str:
    return "chat" if "messages" in body else "completions"


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


class _ChatReader:
    """State carried across chunks: the time field, the synthetic clock, counts of
    output-token sources, and the token-log reader that hashes and validates."""

    def __init__(self, path: str, tok: ChatTokenizer, fields: ChatFields, spec: HashSpec, time_unit: str):
        self.path, self.tok, self.fields, self.spec, self.time_unit = path, tok, fields, spec, time_unit
        self.time_field: str | None = None
        self.id_field: str | None = None
        self.synthetic: bool | None = None  # decided by the first record
        self.records = 0
        self.reader: TokenLogReader | None = None
        self.sources = {"measured": 0, "max_completion_tokens": 0, "max_tokens": 0, "none": 0}

    def fail(self, message: str, line: int, name: str | None = None) -> KvtraceError:
        return KvtraceError(message, path=self.path, line=line, field=name)

    # -- one record ------------------------------------------------------------------
    def unwrap(self, rec: dict, line: int) -> tuple[dict, str, dict]:
        """(body, ``chat`` or ``completions``, wrapper) of one line."""
        f = self.fields
        if "custom_id" in rec and isinstance(rec.get("body"), dict):  # Batch API input
            url = rec.get("url")
            kind = BATCH_URLS.get(url)
            if kind is None:
                raise self.fail(f"Batch API url {short_text(url)}: expected one of {', '.join(BATCH_URLS)}", line,
                                "url")
            return rec["body"], kind, rec
        for name in f.body:
            inner = rec.get(name)
            if isinstance(inner, dict) and ("messages" in inner or "prompt" in inner):
                return inner, _kind(inner), rec
        if "messages" in rec or "prompt" in rec:
            return rec, _kind(rec), {}
        raise self.fail("expected a chat-completions body (messages) or a completions body (prompt), bare or "
                        f"under {' / '.join(repr(b) for b in f.body)}", line, "messages")

    def timestamp(self, wrapper: dict, line: int):
        if self.synthetic is None:
            self.time_field = next((n for n in self.fields.time if wrapper.get(n) is not None), None)
            self.synthetic = self.time_field is None
        if self.synthetic:
            return float(self.records)
        value = wrapper.get(self.time_field)
        if value is None:
            value = next((wrapper[n] for n in self.fields.time if wrapper.get(n) is not None), None)
        if value is None:
            raise self.fail(f"missing (required): expected a timestamp, as the first request has "
                            f"'{self.time_field}'", line, self.time_field)
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise self.fail(f"expected a number or an ISO-8601 string, got {short_text(value)}", line, self.time_field)
        return value

    def messages(self, body: dict, line: int) -> list:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise self.fail(f"expected a non-empty list of messages, got {short_text(msgs)}", line, "messages")
        for i, m in enumerate(msgs):
            where = f"messages[{i}]"
            if not isinstance(m, dict):
                raise self.fail(f"expected a message object, got {short_text(m)}", line, where)
            if not isinstance(m.get("role"), str):
                raise self.fail("missing (required): expected a role (system, user, assistant, tool, ...)", line,
                                f"{where}.role")
            content = m.get("content")
            if content is None or isinstance(content, str):
                continue
            if not isinstance(content, list):
                raise self.fail(f"expected a string or a list of content parts, got {short_text(content)}", line,
                                f"{where}.content")
            for j, part in enumerate(content):
                pw = f"{where}.content[{j}]"
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in _TEXT_PARTS:
                    if not isinstance(part.get("text"), str):
                        raise self.fail(f"expected the part's text as a string, got {short_text(part.get('text'))}",
                                        line, f"{pw}.text")
                    continue
                if not isinstance(part, dict):
                    raise self.fail(f"expected a content part object, got {short_text(part)}", line, pw)
                what = "images are" if "image" in str(kind) else f"'{kind}' parts are"
                raise self.fail(f"content part of type {short_text(kind)}: {what} not supported (only text: other "
                                "parts become model-specific placeholder tokens and multimodal block keys)",
                                line, f"{pw}.type")
        return msgs

    def render(self, body: dict, line: int) -> str:
        msgs = self.messages(body, line)
        tools = body.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise self.fail(f"expected a list of tool objects, got {short_text(tools)}", line, "tools")
        kwargs = body.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise self.fail(f"expected an object, got {short_text(kwargs)}", line, "chat_template_kwargs")
        gen = body.get("add_generation_prompt", True)
        cont = body.get("continue_final_message", False)
        for name, v in (("add_generation_prompt", gen), ("continue_final_message", cont)):
            if not isinstance(v, bool):
                raise self.fail(f"expected true or false, got {short_text(v)}", line, name)
        if gen and cont:
            raise self.fail("continue_final_message needs add_generation_prompt false (vLLM and transformers "
                            "refuse both)", line, "continue_final_message")
        try:
            return self.tok.render(msgs, tools=tools or None, documents=body.get("documents"),
                                   add_generation_prompt=gen, continue_final_message=cont, template_kwargs=kwargs)
        except TemplateFailure as exc:
            raise self.fail(str(exc), line, "messages") from None

    def prompts(self, body: dict, line: int) -> list:
        """A completions body's prompts: each a string or a list of token ids."""
        p = body.get("prompt")

        def is_ids(x) -> bool:
            return isinstance(x, list) and bool(x) and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in x)

        if isinstance(p, str) or is_ids(p):
            return [p]
        if isinstance(p, list) and p and all(isinstance(x, str) or is_ids(x) for x in p):
            return list(p)
        raise self.fail(f"expected a string, a list of strings, or non-empty lists of token ids in [0, 2^31 - 1], "
                        f"got {short_text(p)}", line, "prompt")

    def output_tokens(self, body: dict, wrapper: dict, line: int) -> int:
        f = self.fields
        v = wrapper.get(f.output_tokens)
        name = f.output_tokens
        if v is None:
            for keys in _MEASURED:
                v = _dig(wrapper, keys)
                if v is not None:
                    name = ".".join(keys)
                    break
        if v is not None:
            if not _is_count(v):
                raise self.fail(f"expected a non-negative integer (tokens), got {short_text(v)}", line, name)
            self.sources["measured"] += 1
            return v
        for name in ("max_completion_tokens", "max_tokens"):
            v = body.get(name)
            if v is not None:
                if not _is_count(v):
                    raise self.fail(f"expected a non-negative integer (tokens), got {short_text(v)}", line, name)
                self.sources[name] += 1
                return v
        self.sources["none"] += 1
        return 0

    def text_field(self, rec: dict, name: str, line: int) -> str | None:
        v = rec.get(name)
        if v is None or isinstance(v, str):
            return v
        raise self.fail(f"expected a string, got {short_text(v)}", line, name)

    @staticmethod
    def ident(v):
        return v if v is None or isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) else str(v)

    # -- one chunk -------------------------------------------------------------------
    def convert(self, records: list[tuple[int, dict]]) -> pl.DataFrame:
        f = self.fields
        rows: dict[str, list] = {k: [] for k in ("line", "timestamp", "request_id", "session_id", "tenant",
                                                 "cache_salt", "lora_name", "output_tokens")}
        texts: dict[bool, list[str]] = {True: [], False: []}
        slots: list = []  # per row: ("text", add_special_tokens, index, field) or ("ids", list, None, field)
        for line, rec in records:
            body, kind, wrapper = self.unwrap(rec, line)
            ts = self.timestamp(wrapper, line)
            special = body.get("add_special_tokens", kind == "completions")
            if not isinstance(special, bool):
                raise self.fail(f"expected true or false, got {short_text(special)}", line, "add_special_tokens")
            if kind == "chat":
                texts[special].append(self.render(body, line))
                items = [("text", special, len(texts[special]) - 1, "messages")]
            else:
                items = []
                for p in self.prompts(body, line):
                    if isinstance(p, str):
                        texts[special].append(p)
                        items.append(("text", special, len(texts[special]) - 1, "prompt"))
                    else:
                        items.append(("ids", p, None, "prompt"))
            if self.id_field is None:  # named as the first record names it, for messages
                self.id_field = "custom_id" if "custom_id" in wrapper and f.request_id not in wrapper else f.request_id
            rid = self.ident(wrapper.get(f.request_id, wrapper.get("custom_id")))
            session = self.ident(wrapper.get(f.session_id))
            if session is None and f.user_as_session:
                session = self.ident(body.get("user"))
            tenant = None
            if f.tenant is not None:
                tenant = self.text_field(body if f.tenant in body else wrapper, f.tenant, line)
            model = self.text_field(body, "model", line)
            lora = model if f.lora_from_model and model is not None and model not in f.base_models else None
            salt = self.text_field(body, "cache_salt", line)
            out = self.output_tokens(body, wrapper, line)
            for k, item in enumerate(items):
                rows["line"].append(line)
                rows["timestamp"].append(ts)
                rows["request_id"].append(f"{rid}-{k}" if rid is not None and len(items) > 1 else rid)
                rows["session_id"].append(session)
                rows["tenant"].append(tenant)
                rows["cache_salt"].append(salt)
                rows["lora_name"].append(lora)
                rows["output_tokens"].append(out)
                slots.append(item)
            self.records += 1
        encoded = {flag: self._encode(texts[flag], flag, slots, rows["line"]) for flag in (True, False)}
        toks = [encoded[s[1]][s[2]] if s[0] == "text" else s[1] for s in slots]
        for t, line, s in zip(toks, rows["line"], slots):
            if not t:
                raise self.fail("the prompt tokenizes to no tokens (vLLM rejects empty prompts)", line, s[3])
        return self._canonical(rows, toks)

    def _encode(self, texts: list[str], special: bool, slots: list, lines: list) -> list[list[int]]:
        if not texts:
            return []
        try:
            return self.tok.encode(texts, special)
        except Exception:  # find the text that fails, to name its line
            pass
        at = [lines[r] for r, s in enumerate(slots) if s[0] == "text" and s[1] == special]
        for text, line in zip(texts, at):
            try:
                self.tok.encode([text], special)
            except Exception as exc:
                name = next(s[3] for s, li in zip(slots, lines) if li == line)
                raise self.fail(f"the tokenizer failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                                line, name) from None
        raise KvtraceError("the tokenizer failed on a batch but on none of its texts", path=self.path)

    def _canonical(self, rows: dict, toks: list[list[int]]) -> pl.DataFrame:
        import pyarrow as pa

        lens = np.fromiter((len(t) for t in toks), dtype=np.int64, count=len(toks))
        offsets = np.zeros(len(toks) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        flat = np.fromiter(chain.from_iterable(toks), dtype=np.int64, count=int(offsets[-1]))
        ids = pl.Series("prompt_token_ids", pl.from_arrow(
            pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat)))).cast(pl.List(pl.Int64))
        if self.reader is None:
            tf = TokenFields(timestamp=self.time_field or "timestamp", request_id=self.id_field)
            unit = "s" if self.synthetic else self.time_unit
            self.reader = TokenLogReader(self.path, "jsonl", tf, self.spec, unit, MAX_TOKEN_ID)
            if self.synthetic:
                self.reader.note = ("no timestamps in the log (Batch API input or bare request bodies): requests "
                                    "placed 1 s apart in line order")
        ts = rows["timestamp"]
        if all(isinstance(v, str) for v in ts):
            tcol = pl.Series(ts, dtype=pl.String)
        else:
            for v, line in zip(ts, rows["line"]):
                if isinstance(v, str):
                    raise self.fail(f"expected a number like the lines before, got {short_text(v)}", line,
                                    self.time_field)
            tcol = pl.Series(ts, dtype=pl.Float64)
        df = pl.DataFrame({
            "prompt_token_ids": ids,
            self.reader.fields.timestamp: tcol,
            "output_tokens": pl.Series(rows["output_tokens"], dtype=pl.Int64),
            self.id_field: _id_column(rows["request_id"]),
            "session_id": _id_column(rows["session_id"]),
            "tenant": pl.Series(rows["tenant"], dtype=pl.String),
            "cache_salt": pl.Series(rows["cache_salt"], dtype=pl.String),
            "lora_name": pl.Series(rows["lora_name"], dtype=pl.String),
        })
        if all(v is None for v in rows["request_id"]):
            df = df.drop(self.id_field)
        return self.reader.convert(df, np.asarray(rows["line"], dtype=np.int64))

    def warnings(self) -> list[str]:
        s = self.sources
        out = []
        capped = s["max_completion_tokens"] + s["max_tokens"]
        if capped:
            out.append(f"output_tokens: {capped:,} of {self.records:,} requests from max_completion_tokens / "
                       "max_tokens (the request's cap: an upper bound on what was generated)")
        if s["none"]:
            out.append(f"output_tokens: {s['none']:,} of {self.records:,} requests give no count and no cap: 0")
        if self.tok.clock_read:
            out.append(f"the chat template reads the clock (strftime_now): rendered with "
                       f"{self.tok.clock:%Y-%m-%d %H:%M}, not the server's time of serving")
        return out


def _id_column(values: list) -> pl.Series:
    """Integer ids as they are; any string makes the column strings (numbered later)."""
    if all(v is None or isinstance(v, int) for v in values):
        return pl.Series(values, dtype=pl.Int64)
    return pl.Series([None if v is None else str(v) for v in values], dtype=pl.String)


def _records(path: str, rows: int) -> Iterator[list[tuple[int, dict]]]:
    with open_binary(path) as fh:
        chunk: list[tuple[int, dict]] = []
        for lineno, line in enumerate(fh, start=1):
            if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise KvtraceError(f"malformed JSON ({getattr(exc, 'msg', 'not UTF-8')})", path=path,
                                   line=lineno) from None
            if not isinstance(rec, dict):
                raise KvtraceError("expected a JSON object per line", path=path, line=lineno)
            chunk.append((lineno, rec))
            if len(chunk) >= rows:
                yield chunk
                chunk = []
        if chunk:
            yield chunk


def _tokenizer(tokenizer, chat_template) -> ChatTokenizer:
    if isinstance(tokenizer, ChatTokenizer):
        if chat_template is not None:
            raise UsageError("give the chat template to load_chat_tokenizer with the tokenizer", field="chat-template")
        return tokenizer
    return load_chat_tokenizer(tokenizer, chat_template)


def iter_chat_chunks(path: str | os.PathLike, tokenizer, *, chat_template=None, fields: ChatFields = ChatFields(),
                     spec: HashSpec = HashSpec(), time_unit: str = "auto", chunk_rows: int = CHAT_CHUNK_ROWS,
                     _state: list | None = None) -> Iterator[pl.DataFrame]:
    """Canonical request chunks of a chat log, in file order (see :func:`read_chat_log`)."""
    p = str(path)
    tok = _tokenizer(tokenizer, chat_template)  # before the log is opened: a missing tokenizer fails first
    if not os.path.isfile(p):
        raise KvtraceError("no such file", path=p)
    state = _ChatReader(p, tok, fields, spec, time_unit)
    if _state is not None:
        _state.append(state)
    for records in _records(p, chunk_rows):
        yield state.convert(records)


def read_chat_log(path: str | os.PathLike, tokenizer, *, chat_template=None, fields: ChatFields = ChatFields(),
                  spec: HashSpec = HashSpec(), time_unit: str = "auto",
                  chunk_rows: int = CHAT_CHUNK_ROWS) -> TokenLog:
    """Read an OpenAI request log into a canonical request table.

    Parameters
    ----------
    path : path-like
        JSONL (plain, gzip or zstd): bare request bodies, wrapped bodies or a Batch API
        input file (see the module docstring).
    tokenizer : path-like or ChatTokenizer
        A directory holding ``tokenizer.json`` (+ ``tokenizer_config.json``) or a
        ``tokenizer.json`` file (CLI: ``--tokenizer``); nothing is downloaded.
    chat_template : path-like, optional
        A ``.jinja`` file used instead of the tokenizer's template (CLI:
        ``--chat-template``).
    fields : ChatFields
        Where the time, ids, tenant and output count are.
    spec : HashSpec
        vLLM hash function, ``PYTHONHASHSEED`` and block size in tokens.
    time_unit : str
        ``auto``, ``s``, ``ms``, ``us``, ``ns`` or ``iso`` (as for token logs).
    chunk_rows : int
        Request lines rendered and tokenized together.

    Returns
    -------
    TokenLog
        ``meta.source_format == "openai"``; ``time_note`` says how times were read (or
        that they were made up); ``warnings`` say where output counts came from.
    """
    holder: list = []
    chunks = list(iter_chat_chunks(path, tokenizer, chat_template=chat_template, fields=fields, spec=spec,
                                   time_unit=time_unit, chunk_rows=chunk_rows, _state=holder))
    if not chunks:
        raise KvtraceError("no requests: the log is empty", path=str(path))
    state: _ChatReader = holder[0]
    reader = state.reader
    df = pl.concat(chunks, rechunk=False)
    lines = np.concatenate(reader.lines)
    p = str(path)
    meta = TraceMeta(block_tokens=int(spec.block_tokens), source_format=FORMAT, source=os.path.basename(p))
    return TokenLog(requests=df, meta=meta, spec=spec, time_unit=reader.unit or "s", time_note=reader.note,
                    locate=lambda row: {"path": p, "line": int(lines[row])},
                    warnings=list(reader.warnings) + state.warnings())


def load_chat_trace(path: str | os.PathLike, tokenizer, *, share_tenants: bool = False,
                    **options) -> tuple[Trace, TokenLog]:
    """A chat log as a :class:`~kvtrace.trace.Trace` (trace order, timestamps relative to
    the first request) and the :class:`~kvtrace.ingest.tokens.TokenLog` it came from.
    ``options`` are those of :func:`read_chat_log`."""
    from kvtrace.ingest.canonical import build_trace, prepare_requests

    log = read_chat_log(path, tokenizer, **options)
    meta = log.meta if not share_tenants else TraceMeta(**{**log.meta.to_dict(), "share_tenants": True})
    df, warn = prepare_requests(log.requests, meta, source=str(path), already_relative=False, locate=log.locate)
    return build_trace(df, meta, log.warnings + warn), log
