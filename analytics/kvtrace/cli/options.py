"""Options that several commands share: input formats and enums, the trace and model
options, the Dask options and the request-log options (:func:`with_log_options`)."""

from __future__ import annotations

import contextvars
import functools
import inspect
from enum import Enum
from pathlib import Path
from typing import Callable, Optional

import typer


def parse_path(value: str) -> Path:
    """A path option or argument: an empty string is a usage error (``Path('')`` would
    silently be the current directory)."""
    if not value.strip():
        raise typer.BadParameter("expected a path, got an empty string")
    return Path(value)


class Fmt(str, Enum):
    auto = "auto"
    mooncake = "mooncake"
    bailian = "bailian"
    parquet = "parquet"
    csv = "csv"
    tokens = "tokens"
    openai = "openai"


#: the request-log options of the current command (--format tokens|openai), set by with_log_options
_LOG_OPTIONS = contextvars.ContextVar("kvtrace_log_options", default=None)
#: (parameter, option, help) of every request-log option; the defaults are kvtrace.ingest.LogOptions's
_LOG_PARAMS = (
    ("tokens_field", "--tokens-field", "Token log: the field of the prompt's token ids (default prompt_token_ids)."),
    ("time_field", "--time-field", "Token log: the arrival time field (default timestamp; seconds, ms or ISO-8601: "
     "detected and stated)."),
    ("time_unit", "--time-unit", "Request logs: the timestamps' unit, s, ms, us, ns or iso (default: detected and "
     "stated)."),
    ("salt_field", "--salt-field", "Token log: the cache-salt field (default cache_salt; vLLM hashes it into the "
     "first block)."),
    ("lora_field", "--lora-field", "Token log: the LoRA adapter name field (default lora_name; part of vLLM's block "
     "hashes)."),
    ("hash_fn", "--hash", "Request logs: vLLM's prefix-cache hash, sha256 (vLLM's default) or sha256_cbor."),
    ("hash_seed", "--hash-seed", "Request logs: the PYTHONHASHSEED vLLM ran with (it seeds NONE_HASH; default 0)."),
    ("tokenizer", "--tokenizer", "Chat log (--format openai): a local Hugging Face tokenizer, DIR or tokenizer.json "
     "(nothing is downloaded)."),
    ("chat_template", "--chat-template", "Chat log: a Jinja chat template overriding the tokenizer's."),
)


def with_log_options(fn: Callable) -> Callable:
    """Give a command the request-log options (``--tokens-field`` ... ``--chat-template``)
    without repeating them in its signature: they are added to the signature typer
    reads and handed to :func:`log_options` as one :class:`kvtrace.ingest.LogOptions`."""
    sig = inspect.signature(fn)
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                               default=typer.Option(None, opt, help=text, rich_help_panel="Request logs"))
             for name, opt, text in _LOG_PARAMS]
    extra += [
        inspect.Parameter("rechain", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
            False, "--rechain", rich_help_panel="Block ids",
            help="The trace hashes each block on its own: chain its ids so that a block is reused only after "
                 "the same prefix (kvtrace stats reports whether a trace is chained).")),
        inspect.Parameter("reblock", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[int], default=typer.Option(
            None, "--reblock", min=1, max=1 << 20, rich_help_panel="Block ids",
            help="Coarsen the trace to N tokens per block, a whole multiple of its own (what if the engine used "
                 "larger blocks); on a canonical Parquet trace --block-tokens N does the same.")),
    ]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from kvtrace.ingest import LogOptions

        given = {name: kwargs.pop(name, None) for name, _, _ in _LOG_PARAMS}
        token = _LOG_OPTIONS.set(LogOptions.from_options(**given, rechain=kwargs.pop("rechain", False),
                                                         reblock=kwargs.pop("reblock", None)))
        try:
            return fn(*args, **kwargs)
        finally:
            _LOG_OPTIONS.reset(token)

    wrapper.__signature__ = sig.replace(parameters=list(sig.parameters.values()) + extra)
    wrapper.__annotations__ = {**getattr(fn, "__annotations__", {}), **{p.name: p.annotation for p in extra}}
    return wrapper


def log_options():
    """The current command's :class:`kvtrace.ingest.LogOptions` (None outside a command
    that has them)."""
    return _LOG_OPTIONS.get()


class Eviction(str, Enum):
    prefix_aware = "prefix-aware"
    flat = "flat"


class CacheRules(str, Enum):
    """``--cache-rules``: kvtrace's ideal model, or an engine's own prefix-cache rules
    (:mod:`kvtrace.analyses.engine`)."""

    ideal = "ideal"
    vllm = "vllm"
    sglang = "sglang"


#: ``--cache-rules`` of the tier commands (``whatif``, ``load``): the engine's reuse
#: rules applied to the DRAM / flash tiers (:data:`kvtrace.analyses.whatif.TIER_RULES`).
TierCacheRulesOpt = typer.Option(
    CacheRules.ideal, "--cache-rules", help="ideal (kvtrace's model), vllm or sglang: the engine's reuse rules on the "
                                            "tiers (a request's last block recomputed, only full blocks stored); its "
                                            "GPU-pool rules are kvtrace curve --cache-rules.")


class Engine(str, Enum):
    local = "local"
    dask = "dask"


# Options shared by the commands that read a trace or need a model.
TraceArg = typer.Argument(..., metavar="TRACE", parser=parse_path, help="Trace file (JSONL, Parquet or CSV).")
MfuOpt = typer.Option(None, "--mfu", help="Prefill model FLOPs utilisation (0-1].")
GpuPriceOpt = typer.Option(None, "--gpu-price", help="$ per GPU-hour.")
FormatOpt = typer.Option(Fmt.auto, "--format", "-f", help="Input format (auto-detected from suffix and fields).")
BlockTokensOpt = typer.Option(None, "--block-tokens", min=1, max=1 << 20, help="Tokens per block (default: the "
                                                                               "format's; required for generic "
                                                                               "tables).")
ShareTenantsOpt = typer.Option(False, "--share-tenants", help="Equal hashes in different tenants are the same block.")
ModelOpt = typer.Option(None, "--model", "-m", help="Model preset or path to a Hugging Face config.json (default "
                                                    "Llama-3.1-70B; see `kvtrace models`).")
KvBytesOpt = typer.Option(None, "--kv-bytes-per-token", min=1, max=1 << 24, help="Override KV bytes per token.")
DtypeOpt = typer.Option(None, "--dtype", help="KV-cache dtype: fp32, bf16, fp16, fp8, int8, fp4.")
EngineOpt = typer.Option(Engine.local, "--engine", help="local (this machine) or dask (a Dask cluster; pip install "
                                                        "'kvtrace\\[dask]'): curve gives a partitioned estimate with "
                                                        "its error bound, whatif runs one configuration per task.")
SchedulerOpt = typer.Option(None, "--scheduler", help="Dask scheduler address, e.g. tcp://10.0.0.5:8786 (default: "
                                                      "start a local cluster of --workers processes).")



class LibraryDefault:
    """An option's default that the library states, read only when it is needed: by
    ``--help`` (``str``) or by a run that leaves the option out (click converts it with
    ``str`` or ``float``). Importing an analysis to state a default would slow the start
    of every command.

    ``LibraryDefault("kvtrace.analyses.value", "DEFAULT_HORIZON")``; for an attribute of a
    class's default instance, ``LibraryDefault("kvtrace.analyses.response", "ResponseModel",
    field="dram_latency_ms")``."""

    def __init__(self, module: str, name: str, *, field: str | None = None):
        self.module, self.name, self.field = module, name, field

    def value(self):
        import importlib

        v = getattr(importlib.import_module(self.module), self.name)
        return v if self.field is None else getattr(v(), self.field)

    def __str__(self) -> str:
        return str(self.value())

    def __float__(self) -> float:
        return float(self.value())

#: ``--horizon``'s default: kvtrace.analyses.value.DEFAULT_HORIZON
HorizonDefault = LibraryDefault("kvtrace.analyses.value", "DEFAULT_HORIZON")
