"""A local Hugging Face tokenizer and its chat template, applied as transformers does.

:func:`load_chat_tokenizer` reads ``tokenizer.json`` (with the ``tokenizers`` package)
and the chat template and special tokens of ``tokenizer_config.json`` next to it.
Nothing is ever downloaded: only local files are opened, ``Tokenizer.from_pretrained``
is never called, and a missing tokenizer is a one-line :class:`KvtraceError` naming
the option to pass.

How rendering mirrors ``transformers`` (``PreTrainedTokenizerBase.apply_chat_template``
and ``utils/chat_template_utils.py``, read at huggingface/transformers main)
------------------------------------------------------------------------------------
- The environment is ``jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
  lstrip_blocks=True)`` with the ``loopcontrols`` extension (``{% break %}``) and a
  ``{% generation %}`` tag (transformers' ``AssistantTracker``; it only marks
  assistant spans, so here it renders its body and nothing else).
- Globals ``raise_exception(msg)`` (a ``TemplateError``) and ``strftime_now(fmt)``;
  the ``tojson`` filter is transformers' ``json.dumps(x, ensure_ascii=False,
  indent=indent, separators=separators, sort_keys=sort_keys)``, not Jinja's
  HTML-escaping one.
- The template is rendered with ``messages``, ``tools`` (None when the request has
  none), ``documents`` (None), ``add_generation_prompt`` and, as transformers'
  ``template_kwargs = {**self.special_tokens_map, **kwargs}``, the named special
  tokens (``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``, ``pad_token``,
  ``cls_token``, ``mask_token``: strings, or the ``content`` of an AddedToken dict;
  ``additional_special_tokens`` as a list of strings) overridden by the request's
  ``chat_template_kwargs``.
- Messages are passed as they are: list ``content`` stays a list of parts for the
  template to walk, tool-call ``arguments`` stay JSON strings.
- The rendered text is tokenized with ``add_special_tokens=False`` (the template wrote
  them), and with no truncation or padding (transformers turns off any that
  ``tokenizer.json`` carries).
- Template choice is ``get_chat_template``'s: an override file wins; a single template
  is used for every request; named templates (the list form of ``chat_template``, or
  ``additional_chat_templates/*.jinja``) give ``tool_use`` to requests with tools when
  there is one, else ``default``. A ``chat_template.jinja`` in the directory takes
  precedence over ``tokenizer_config.json``'s, as in ``from_pretrained``.

Known differences: ``strftime_now`` reads a clock fixed when the tokenizer is loaded
(transformers reads it at each call), so every request of a run sees the same date and
a run is reproducible; pass ``clock`` to pin it to when the log was served.
``tokenizer_config.json``'s ``add_bos_token`` / ``add_eos_token`` (which
``LlamaTokenizerFast`` folds into its post-processor) are not applied: the
post-processor of ``tokenizer.json`` is used as saved.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kvtrace.errors import KvtraceError, UsageError

#: What to pass when no tokenizer is found (the CLI's option).
TOKENIZER_HINT = "--tokenizer DIR_OR_tokenizer.json: a local Hugging Face tokenizer; nothing is downloaded"
#: transformers' ``SPECIAL_TOKENS_ATTRIBUTES``.
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                  "additional_special_tokens")


class TemplateFailure(Exception):
    """A chat template raised while rendering (the reader adds the file and line)."""


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # an AddedToken as tokenizer_config.json stores it
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens_map(config: dict) -> dict:
    """Template variables for the special tokens of a ``tokenizer_config.json`` (its
    ``special_tokens_map``: the tokens that are set, as strings)."""
    out: dict[str, Any] = {}
    for name in SPECIAL_TOKENS:
        value = config.get(name)
        if name == "additional_special_tokens":
            texts = [t for t in (_token_text(v) for v in value or []) if t is not None] \
                if isinstance(value, list) else []
            if texts:
                out[name] = texts
        elif _token_text(value):
            out[name] = _token_text(value)
    extra = config.get("extra_special_tokens")  # model-specific names (image_token, ...) in recent configs
    if isinstance(extra, dict):
        for name, value in extra.items():
            if isinstance(name, str) and _token_text(value) and name not in out:
                out[name] = _token_text(value)
    return out


@dataclass
class ChatTokenizer:
    """A local tokenizer with its chat templates.

    Attributes
    ----------
    tokenizer : tokenizers.Tokenizer
        Truncation and padding turned off.
    templates : str, dict or None
        One template, or named ones (``default``, ``tool_use``, ...); None when the
        tokenizer has none (completions still work).
    template_source : str
        The file the template came from (for messages).
    special : dict
        Special-token template variables (see :func:`special_tokens_map`).
    path : str
        The ``tokenizer.json`` read.
    clock : datetime
        What ``strftime_now`` formats.
    """

    tokenizer: Any
    templates: str | dict | None
    template_source: str
    special: dict
    path: str
    clock: datetime
    clock_read: bool = False
    _compiled: dict = field(default_factory=dict, repr=False)

    # -- templates -------------------------------------------------------------------
    def template_for(self, has_tools: bool) -> str:
        """The template a request gets (transformers' ``get_chat_template``)."""
        t = self.templates
        if t is None:
            raise TemplateFailure(f"the tokenizer has no chat template ({self.template_source}): pass "
                                  "--chat-template FILE (a .jinja file)")
        if isinstance(t, str):
            return t
        if has_tools and "tool_use" in t:
            return t["tool_use"]
        if "default" in t:
            return t["default"]
        raise TemplateFailure(f"{len(t)} named chat templates ({', '.join(sorted(t))}) and none is 'default': "
                              "pass --chat-template FILE")

    def compiled(self, source: str):
        got = self._compiled.get(source)
        if got is None:
            got = self._compiled[source] = self._compile(source)
        return got

    def _compile(self, source: str):
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class GenerationTag(Extension):
            # transformers' AssistantTracker tag: marks assistant spans, renders its body
            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

            def _body(self, caller):
                return caller()

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        def strftime_now(fmt):
            self.clock_read = True
            return self.clock.strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[GenerationTag, "jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        try:
            return env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise KvtraceError(f"the chat template does not parse (template line {exc.lineno}): {exc.message}",
                               path=self.template_source, field="chat_template") from None

    # -- rendering -------------------------------------------------------------------
    def render(self, messages: list, *, tools: list | None = None, documents: list | None = None,
               add_generation_prompt: bool = True, continue_final_message: bool = False,
               template_kwargs: dict | None = None) -> str:
        """One conversation as transformers' ``apply_chat_template(..., tokenize=False)``
        renders it. Raises :class:`TemplateFailure` on any template error."""
        template = self.compiled(self.template_for(tools is not None))
        kwargs = {**self.special, **(template_kwargs or {})}
        for reserved in ("messages", "tools", "documents", "add_generation_prompt"):
            kwargs.pop(reserved, None)
        tag = "CONTINUE_FINAL_MESSAGE_TAG "
        final = None
        if continue_final_message:
            messages, final = _tag_final_message(messages, tag)
        try:
            text = template.render(messages=messages, tools=tools, documents=documents,
                                   add_generation_prompt=add_generation_prompt, **kwargs)
        except TemplateFailure:
            raise
        except Exception as exc:  # TemplateError, raise_exception, a TypeError in the template, ...
            raise TemplateFailure(f"the chat template failed: {type(exc).__name__}: {exc}") from None
        if final is not None:
            if final.strip() not in text or tag.strip() not in text:
                raise TemplateFailure("continue_final_message: the final message does not appear in the "
                                      "rendered chat (the template drops or rewrites it)")
            at = text.rindex(tag.strip())
            text = text[:at] if text[at:at + len(tag)] == tag else text[:at].rstrip()
        return text

    # -- tokenization ----------------------------------------------------------------
    def encode(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        """Token ids of each text (``encode_batch``: parallel in the Rust library)."""
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)]


def _tag_final_message(messages: list, tag: str) -> tuple[list, str]:
    """transformers' ``continue_final_message``: a marker after the last message's text,
    cut off after rendering."""
    if not messages or not isinstance(messages[-1], dict):
        raise TemplateFailure("continue_final_message is set but there is no final message")
    last = dict(messages[-1])
    content = last.get("content")
    if isinstance(content, str):
        final = content
        last["content"] = content + tag
    elif isinstance(content, list):
        parts = [dict(p) if isinstance(p, dict) else p for p in content]
        for p in reversed(parts):
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                final = p["text"]
                p["text"] = final + tag
                break
        else:
            raise TemplateFailure("continue_final_message is set but the final message has no text")
        last["content"] = parts
    else:
        raise TemplateFailure("continue_final_message is set but the final message has no content")
    return [*messages[:-1], last], final


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KvtraceError(f"cannot read as JSON: {exc}", path=str(path)) from None
    if not isinstance(data, dict):
        raise KvtraceError("expected a JSON object", path=str(path))
    return data


def _templates_of(config: dict, config_path: Path) -> str | dict | None:
    t = config.get("chat_template")
    if t is None or isinstance(t, str):
        return t
    if isinstance(t, list) and all(isinstance(x, dict) and isinstance(x.get("name"), str)
                                   and isinstance(x.get("template"), str) for x in t):
        return {x["name"]: x["template"] for x in t}
    raise KvtraceError("expected a template string or a list of {\"name\", \"template\"}", path=str(config_path),
                       field="chat_template")


def _tokenizer_paths(path: str | os.PathLike) -> tuple[Path, Path, Path, Path]:
    """Where :func:`load_chat_tokenizer` looks for a tokenizer at ``path``: its
    ``tokenizer.json``, and beside it ``tokenizer_config.json``, ``chat_template.jinja``
    and the directory ``additional_chat_templates``."""
    p = Path(path)
    tok_file = p / "tokenizer.json" if p.is_dir() else p
    folder = tok_file.parent
    return (tok_file, folder / "tokenizer_config.json", folder / "chat_template.jinja",
            folder / "additional_chat_templates")


def tokenizer_files(path: str | os.PathLike) -> list[Path]:
    """The files :func:`load_chat_tokenizer` reads for a tokenizer at ``path``: its
    ``tokenizer.json`` (listed whether or not it exists), then those present of
    ``tokenizer_config.json``, ``chat_template.jinja`` and
    ``additional_chat_templates/*.jinja`` (a dangling link counts as present)."""
    tok_file, config, jinja, extra = _tokenizer_paths(path)
    named = sorted(extra.glob("*.jinja")) if extra.is_dir() else []
    return [tok_file, *(f for f in (config, jinja) if os.path.lexists(f)), *named]


def load_chat_tokenizer(path: str | os.PathLike | None, chat_template: str | os.PathLike | None = None, *,
                        clock: datetime | None = None) -> ChatTokenizer:
    """A local Hugging Face tokenizer and its chat template(s); nothing is downloaded.

    Parameters
    ----------
    path : path-like
        A directory holding ``tokenizer.json`` (and ``tokenizer_config.json``), or a
        ``tokenizer.json`` file (its ``tokenizer_config.json`` is looked for beside it).
        CLI: ``--tokenizer``.
    chat_template : path-like, optional
        A Jinja template file used instead of the tokenizer's. CLI: ``--chat-template``.
    clock : datetime, optional
        What the template's ``strftime_now`` formats (default: the time of loading).

    Returns
    -------
    ChatTokenizer

    Raises
    ------
    KvtraceError
        No such tokenizer (naming ``--tokenizer``), an unreadable file, a template that
        does not parse.
    """
    if path is None or not str(path).strip():
        raise UsageError(f"no tokenizer: pass {TOKENIZER_HINT}", field="tokenizer")
    p = Path(path)
    tok_file, config_path, jinja_file, extra_dir = _tokenizer_paths(p)
    if not tok_file.is_file():
        what = "no tokenizer.json in this directory" if p.is_dir() else "no such tokenizer"
        raise UsageError(f"{what}: pass {TOKENIZER_HINT}", path=str(p))
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - a declared dependency
        raise KvtraceError("reading chat logs needs the tokenizers package (pip install tokenizers)") from None
    try:
        tok = Tokenizer.from_file(str(tok_file))
    except Exception as exc:
        raise KvtraceError(f"cannot read as a Hugging Face tokenizer: {str(exc).splitlines()[0]}",
                           path=str(tok_file)) from None
    tok.no_truncation()
    tok.no_padding()
    config = _read_json(config_path) if config_path.is_file() else {}
    templates = _templates_of(config, config_path)
    source = str(config_path) if config_path.is_file() else str(tok_file)
    if jinja_file.is_file():
        templates, source = jinja_file.read_text(encoding="utf-8"), str(jinja_file)
    if extra_dir.is_dir():
        named = {f.stem: f.read_text(encoding="utf-8") for f in sorted(extra_dir.glob("*.jinja"))}
        if named:
            templates = {**({"default": templates} if isinstance(templates, str) else templates or {}), **named}
    if chat_template is not None:
        t = Path(chat_template)
        if not t.is_file():
            raise UsageError("no such chat template file: pass --chat-template FILE (a .jinja file)", path=str(t))
        try:
            templates, source = t.read_text(encoding="utf-8"), str(t)
        except (OSError, UnicodeDecodeError) as exc:
            raise KvtraceError(f"cannot read the chat template: {exc}", path=str(t)) from None
    out = ChatTokenizer(tokenizer=tok, templates=templates, template_source=source,
                        special=special_tokens_map(config), path=str(tok_file), clock=clock or datetime.now())
    for t in ([templates] if isinstance(templates, str) else (templates or {}).values()):
        out.compiled(t)  # a template that does not parse fails now, naming its file
    return out
