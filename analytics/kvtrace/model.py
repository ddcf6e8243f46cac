"""Model and GPU descriptions: KV bytes per token and the prefill compute a hit avoids.

A trace stores tokens, never bytes, so one trace serves every model (DESIGN §1). This
module turns tokens into the two quantities every analysis needs:

* **KV bytes per token** — what a cached token occupies in memory or flash::

      MHA / GQA:  layers x kv_heads x head_dim x dtype_bytes x 2     (K and V)
      MLA:        layers x (kv_lora_rank + rope_dim) x dtype_bytes  (one shared latent)

* **Prefill FLOPs** — what recomputing a token costs. A token at 0-based position
  ``p`` of its request costs ``a + b x p`` FLOPs with ``a = 2 x active_params`` (the
  matrix multiplies) and ``b = 4 x layers x q_heads x head_dim`` (scores and weighted
  sum against the ``p`` earlier tokens).

Kernels use the decomposition of :meth:`ModelSpec.flops_coefficients`: a block of
``k`` tokens whose first token sits at position ``s`` costs ``a x k + b x q`` FLOPs,
where ``q = k x s + k x (k - 1) / 2`` is its *position-token sum* (the sum of the
positions of its tokens, :func:`position_token_sum`). A kernel therefore accumulates
two numbers per block (tokens and position-token sum) and stays model-independent; the
model enters only through ``(a, b)`` at the end.

The GPU side (peak, MFU, price: :class:`GpuSpec`, :data:`GPUS`, :func:`resolve_gpu`)
lives in :mod:`kvtrace.gpu` and is re-exported here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from kvtrace.errors import KvtraceError, UsageError
from kvtrace.gpu import DEFAULT_GPU, DEFAULT_MFU, GPUS, GpuSpec, gpus_table, resolve_gpu
from kvtrace.presets import Presets, is_real

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_MFU",
    "DEFAULT_MODEL",
    "DTYPES",
    "GPUS",
    "GpuSpec",
    "MODELS",
    "ModelSpec",
    "dtype_bytes",
    "gpus_table",
    "load_hf_config",
    "models_table",
    "position_token_sum",
    "resolve_gpu",
    "resolve_model",
]

# --------------------------------------------------------------------------- dtypes

#: Bytes per KV element for each cache dtype. Values are exact (``int`` or
#: :class:`fractions.Fraction`) so that a 4-bit cache still yields an exact whole number
#: of bytes per token. ``fp4`` counts the 4-bit elements only: block-scaled formats
#: (NVFP4, MXFP4) add one scale per 16 or 32 elements, which is not modelled — pass
#: ``kv_bytes_per_token`` for an exact figure.
DTYPES: dict[str, int | Fraction] = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "fp4": Fraction(1, 2),
}

# Spellings found in Hugging Face configs (``torch_dtype``) and on command lines.
_DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e4m3": "fp8",
    "float8_e5m2": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
}


def _dtype_name(name: str) -> str | None:
    key = str(name).strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    return key if key in DTYPES else None


def dtype_bytes(name: str, *, field: str = "dtype") -> int | Fraction:
    """Bytes per KV element of a dtype name.

    Parameters
    ----------
    name : str
        ``fp32``, ``bf16``, ``fp16``, ``fp8``, ``int8``, ``fp4``, or a torch spelling
        such as ``bfloat16`` / ``float8_e4m3fn``.
    field : str
        Field name reported in the error.

    Returns
    -------
    int or Fraction
        Bytes per element (``Fraction(1, 2)`` for ``fp4``).

    Raises
    ------
    UsageError
        For an unknown dtype.
    """
    canonical = _dtype_name(name)
    if canonical is None:
        raise UsageError(f"unknown dtype '{name}': expected one of {', '.join(DTYPES)}", field=field)
    return DTYPES[canonical]


def _dtype_label(nbytes: int | Fraction) -> str:
    # Bytes are all the model needs, so the label names the width, not bf16 vs fp16.
    labels = {4: "fp32", 2: "16-bit", 1: "8-bit", Fraction(1, 2): "4-bit"}
    return labels.get(nbytes, f"{nbytes} B")


def _exact_bytes(value: int | float | Fraction, field: str) -> int | Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise KvtraceError(f"expected a number of bytes, got {value!r}", field=field)
    # str() keeps a float such as 0.5 or 0.5625 exact in decimal terms.
    exact = Fraction(str(value)) if isinstance(value, float) else Fraction(value)
    if exact <= 0:
        raise KvtraceError(f"expected a positive number of bytes, got {value!r}", field=field)
    return int(exact) if exact.denominator == 1 else exact


def position_token_sum(n_tokens, start_pos=0):
    """Sum of the 0-based positions of ``n_tokens`` tokens starting at ``start_pos``.

    ``q = n x s + n x (n - 1) / 2``. A block's prefill FLOPs are ``a x n + b x q``
    (see :meth:`ModelSpec.flops_coefficients`).

    Parameters
    ----------
    n_tokens : int or array_like
        Tokens in the block (>= 0).
    start_pos : int or array_like
        Position (tokens from the start of the request) of the block's first token.

    Returns
    -------
    float or numpy.ndarray
        Position-token sum in tokens², float64 (exact below 2**53).
    """
    n = np.asarray(n_tokens, dtype=np.float64)
    s = np.asarray(start_pos, dtype=np.float64)
    if np.any(n < 0) or np.any(s < 0):
        raise ValueError("n_tokens and start_pos must be non-negative")
    q = n * s + n * (n - 1.0) / 2.0
    return float(q) if q.ndim == 0 else q


# --------------------------------------------------------------------------- models


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The shape of a model as far as KV-cache size and prefill compute go.

    Parameters
    ----------
    name : str
        Display name.
    attention : {"mha", "mla"}
        ``"mha"`` for multi-head and grouped-query attention (K and V cached per KV
        head); ``"mla"`` for DeepSeek's multi-head latent attention (one compressed
        latent plus a RoPE key cached per layer).
    layers : int
        Transformer layers with a KV cache.
    q_heads : int
        Query (attention) heads per layer; attention FLOPs scale with these.
    kv_heads : int
        KV heads per layer (MHA/GQA). For MLA it is 1: every head reads the same
        cached latent.
    head_dim : int
        Per-head query·key dimension in elements, used for the attention FLOPs and, for
        MHA/GQA, the KV size. For MLA it is ``qk_nope_head_dim + qk_rope_head_dim``.
    active_params : float
        Parameters active per token (all of them for a dense model, the routed subset
        for mixture-of-experts), in parameters.
    kv_lora_rank : int
        MLA latent width in elements (0 for MHA/GQA).
    rope_dim : int
        MLA decoupled RoPE key width in elements (0 for MHA/GQA).
    dtype_bytes : int or Fraction
        Bytes per cached KV element (2 for bf16/fp16; ``Fraction(1, 2)`` for fp4).
    kv_bytes_per_token_override : int, optional
        Bytes per token to use instead of the formula (e.g. a measured figure, or a
        block-scaled format). Wins over the formula and over ``dtype_bytes``.

    Notes
    -----
    Sliding-window and other local-attention layers are treated as full attention,
    for both the KV size and the FLOPs.
    """

    name: str
    attention: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    active_params: float
    kv_lora_rank: int = 0
    rope_dim: int = 0
    dtype_bytes: int | Fraction = 2
    kv_bytes_per_token_override: int | None = None

    def __post_init__(self) -> None:
        if self.attention not in ("mha", "mla"):
            raise KvtraceError(f"expected 'mha' or 'mla', got {self.attention!r}", field="attention")
        for field in ("layers", "q_heads", "kv_heads", "head_dim"):
            _check_positive_int(getattr(self, field), field)
        if self.attention == "mla":
            _check_positive_int(self.kv_lora_rank, "kv_lora_rank")
            _check_positive_int(self.rope_dim, "rope_dim", allow_zero=True)
        active = self.active_params
        if not is_real(active) or not math.isfinite(active) or active <= 0:
            raise KvtraceError(f"expected a positive parameter count, got {active!r}", field="active_params")
        object.__setattr__(self, "active_params", float(active))
        object.__setattr__(self, "dtype_bytes", _exact_bytes(self.dtype_bytes, "dtype_bytes"))
        if self.kv_bytes_per_token_override is not None:
            _check_positive_int(self.kv_bytes_per_token_override, "kv_bytes_per_token")
        else:
            # Fail at construction, not deep inside a replay, when fp4 or an odd dtype
            # would make bytes per token fractional.
            exact = self._formula_bytes()
            if exact.denominator != 1:
                raise KvtraceError(
                    f"{self.name}: {exact} bytes per token is not a whole number "
                    f"(dtype_bytes={self.dtype_bytes}); pass kv_bytes_per_token",
                    field="dtype",
                )

    def _formula_bytes(self) -> Fraction:
        if self.attention == "mla":
            elements = self.layers * (self.kv_lora_rank + self.rope_dim)
        else:
            elements = self.layers * self.kv_heads * self.head_dim * 2
        return elements * Fraction(self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies across all layers (bytes, exact)."""
        if self.kv_bytes_per_token_override is not None:
            return self.kv_bytes_per_token_override
        return int(self._formula_bytes())

    @property
    def dtype(self) -> str:
        """Label of the cache element width (``16-bit``, ``8-bit``, ...)."""
        return _dtype_label(self.dtype_bytes)

    def bytes_per_block(self, block_tokens):
        """KV bytes of a block.

        Parameters
        ----------
        block_tokens : int or numpy.ndarray
            Tokens in the block (an array of per-block token counts works too).

        Returns
        -------
        int or numpy.ndarray
            Bytes.
        """
        return block_tokens * self.kv_bytes_per_token

    def with_dtype(self, dtype: str) -> ModelSpec:
        """The same model with a different KV-cache dtype (see :data:`DTYPES`)."""
        return dataclasses.replace(self, dtype_bytes=dtype_bytes(dtype))

    def flops_coefficients(self) -> tuple[float, float]:
        """Coefficients of the per-token prefill cost ``a + b x position``.

        Returns
        -------
        a : float
            ``2 x active_params``: FLOPs per token independent of position.
        b : float
            ``4 x layers x q_heads x head_dim``: extra FLOPs per token per earlier
            token (QKᵀ and attention-weighted V, 2 FLOPs per multiply-add each).

        Notes
        -----
        A block of ``k`` tokens starting at position ``s`` costs ``a x k + b x q``
        FLOPs with ``q = k x s + k x (k - 1) / 2`` (:func:`position_token_sum`).
        Kernels accumulate ``k`` and ``q`` and apply ``(a, b)`` once at the end.
        For MLA, ``b`` uses the q·k head dim for both products, which overstates the
        attention term slightly (the V head dim is smaller).
        """
        a = 2.0 * self.active_params
        b = 4.0 * self.layers * self.q_heads * self.head_dim
        return a, b

    def prefill_flops(self, n_tokens, start_pos=0):
        """Prefill FLOPs of ``n_tokens`` consecutive tokens starting at ``start_pos``.

        Exact sum over positions ``start_pos .. start_pos + n_tokens - 1`` of
        ``a + b x position``, i.e. ``a x n + b x (n x s + n x (n - 1) / 2)``.

        Parameters
        ----------
        n_tokens : int or array_like
            Tokens (>= 0).
        start_pos : int or array_like
            Position of the first token in its request (tokens, >= 0).

        Returns
        -------
        float or numpy.ndarray
            FLOPs (float64).
        """
        a, b = self.flops_coefficients()
        n = np.asarray(n_tokens, dtype=np.float64)
        flops = a * n + b * np.asarray(position_token_sum(n, start_pos))
        return float(flops) if flops.ndim == 0 else flops


def _check_positive_int(value: Any, field: str, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not ok or value < (0 if allow_zero else 1):
        kind = "non-negative" if allow_zero else "positive"
        raise KvtraceError(f"expected a {kind} integer, got {value!r}", field=field)


def _mha(name: str, layers: int, q: int, kv: int, hd: int, active: float) -> ModelSpec:
    return ModelSpec(name=name, attention="mha", layers=layers, q_heads=q, kv_heads=kv,
                     head_dim=hd, active_params=active)


# Shapes from each model's published Hugging Face config.json (num_hidden_layers,
# num_attention_heads, num_key_value_heads, head_dim or hidden_size/heads); parameter
# counts from the model cards (Llama 3.1 card table, Qwen "Number of Parameters",
# Mistral 7B paper/card, DeepSeek-V3 report: 37B activated of 671B). Every preset's
# count also agrees within 2 % with load_hf_config's estimate from the same config.
_MODEL_LIST = [
    # meta-llama/Llama-3.1-8B: hidden 4096, 32 layers, 32 heads, 8 KV heads.
    _mha("Llama-3.1-8B", 32, 32, 8, 128, 8.03e9),
    # meta-llama/Llama-3.1-70B: hidden 8192, 80 layers, 64 heads, 8 KV heads.
    _mha("Llama-3.1-70B", 80, 64, 8, 128, 70.6e9),
    # meta-llama/Llama-3.1-405B: hidden 16384, 126 layers, 128 heads, 8 KV heads.
    _mha("Llama-3.1-405B", 126, 128, 8, 128, 405.9e9),
    # Qwen/Qwen2.5-7B: hidden 3584, 28 layers, 28 heads, 4 KV heads; 7,615,616,512
    # parameters (the card truncates to 7.61B).
    _mha("Qwen2.5-7B", 28, 28, 4, 128, 7.62e9),
    # Qwen/Qwen2.5-72B: hidden 8192, 80 layers, 64 heads, 8 KV heads; card: 72.7B.
    _mha("Qwen2.5-72B", 80, 64, 8, 128, 72.7e9),
    # Qwen/Qwen3-32B: hidden 5120 but explicit head_dim 128 (not 5120/64), 64 layers,
    # 64 heads, 8 KV heads; card: 32.8B.
    _mha("Qwen3-32B", 64, 64, 8, 128, 32.8e9),
    # Qwen/Qwen3-235B-A22B: hidden 4096, head_dim 128, 94 layers, 64 heads, 4 KV heads,
    # 128 experts of which 8 active; card: 22B activated.
    _mha("Qwen3-235B-A22B", 94, 64, 4, 128, 22e9),
    # mistralai/Mistral-7B-v0.1: hidden 4096, 32 layers, 32 heads, 8 KV heads; 7.24B.
    # (v0.1's 4096-token sliding window is ignored, as for every model here.)
    _mha("Mistral-7B", 32, 32, 8, 128, 7.24e9),
    # deepseek-ai/DeepSeek-V3: 61 layers, 128 heads, kv_lora_rank 512, qk_rope_head_dim
    # 64, qk_nope_head_dim 128 (q·k head dim 192); 37B activated.
    ModelSpec(name="DeepSeek-V3", attention="mla", layers=61, q_heads=128, kv_heads=1,
              head_dim=192, kv_lora_rank=512, rope_dim=64, active_params=37e9),
]

# Other names for the same architecture (same config shape, different weights).
_MODEL_ALIASES = {
    "Llama-3.1-8B": ("llama3.1-8b",),
    "Llama-3.1-70B": ("llama3.1-70b", "Llama-3.3-70B", "llama3.3-70b"),
    "Llama-3.1-405B": ("llama3.1-405b",),
    "Qwen3-235B-A22B": ("Qwen3-235B-A22B-2507", "Qwen3-235B-A22B-Thinking-2507"),
    "Mistral-7B": ("Mistral-7B-v0.1", "Mistral-7B-v0.2", "Mistral-7B-v0.3", "mistral"),
    "DeepSeek-V3": ("DeepSeek-V3-0324", "DeepSeek-V3.1", "DeepSeek-R1", "DeepSeek-R1-0528"),
}

#: Preset models by canonical name. Lookup is case-insensitive and accepts aliases
#: and Hugging Face repo ids (``MODELS["meta-llama/Llama-3.1-70B-Instruct"]``);
#: iteration yields canonical names only.
MODELS: Mapping[str, ModelSpec] = Presets({m.name: m for m in _MODEL_LIST}, _MODEL_ALIASES)

DEFAULT_MODEL = "Llama-3.1-70B"


# --------------------------------------------------------------------------- HF config

_MISSING = object()


def _cfg_int(cfg: dict, key: str, path: str, *, default: Any = _MISSING, why: str = "") -> Any:
    value = cfg.get(key)
    if value is None:
        if default is not _MISSING:
            return default
        raise KvtraceError(f"missing required field{why}", path=path, field=key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KvtraceError(f"expected a non-negative integer, got {value!r}", path=path, field=key)
    return value


def _read_config(path: str | os.PathLike) -> tuple[dict, Path]:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise KvtraceError("no such file (expected a config.json or a directory holding one)", path=str(p))
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KvtraceError(f"cannot read file: {exc}", path=str(p)) from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KvtraceError(f"not valid JSON: {exc.msg} (column {exc.colno})", path=str(p), line=exc.lineno) from None
    if not isinstance(cfg, dict):
        raise KvtraceError("expected a JSON object", path=str(p))
    # Multimodal checkpoints keep the language model's shape in text_config.
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    return cfg, p


def load_hf_config(
    path: str | os.PathLike,
    *,
    name: str | None = None,
    active_params: float | None = None,
) -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` on disk.

    Parameters
    ----------
    path : path-like
        A ``config.json`` file, or a directory that holds one.
    name : str, optional
        Display name; defaults to the directory holding the file.
    active_params : float, optional
        Parameters active per token. Defaults to an estimate from the config (see
        Notes); give the published figure when you know it.

    Returns
    -------
    ModelSpec
        ``dtype_bytes`` follows ``torch_dtype`` (or ``dtype``); bf16 when absent.
        MLA when the config has ``kv_lora_rank``.

    Raises
    ------
    KvtraceError
        Missing file, invalid JSON, or a missing or malformed field (named in the
        error).

    Notes
    -----
    The active-parameter estimate counts the input embedding, the output head
    (once if ``tie_word_embeddings``, which defaults to true as in transformers),
    attention projections (MLA's low-rank ones included), and a gated (SwiGLU) MLP per
    layer; for mixture-of-experts it counts the ``num_experts_per_tok`` routed experts,
    the shared experts and the router, and keeps dense the layers named by
    ``first_k_dense_replace``, ``moe_layer_freq``, ``decoder_sparse_step`` and
    ``mlp_only_layers``. Biases, norms and multi-token-prediction layers are left out.
    It lands within about 2 % of published counts for the preset models. It is a
    parameter count, as published figures are: the embedding lookup costs no FLOPs
    and the output head runs only for the last prompt token, so ``2 x active_params``
    slightly overstates per-token prefill compute (about 3 % for Llama-3.1-70B).
    """
    cfg, p = _read_config(path)
    where = str(p)
    layers = _cfg_int(cfg, "num_hidden_layers", where)
    q_heads = _cfg_int(cfg, "num_attention_heads", where)

    if cfg.get("kv_lora_rank") is not None:
        attention = "mla"
        kv_lora_rank = _cfg_int(cfg, "kv_lora_rank", where)
        rope_dim = _cfg_int(cfg, "qk_rope_head_dim", where)
        head_dim = _cfg_int(cfg, "qk_nope_head_dim", where) + rope_dim
        kv_heads = 1
    else:
        attention, kv_lora_rank, rope_dim = "mha", 0, 0
        kv_heads = _cfg_int(cfg, "num_key_value_heads", where, default=q_heads)
        head_dim = _cfg_int(cfg, "head_dim", where, default=None)
        if head_dim is None:
            hidden = _cfg_int(cfg, "hidden_size", where, why=" (no head_dim given)")
            if q_heads == 0 or hidden % q_heads:
                raise KvtraceError(
                    f"hidden_size {hidden} is not a multiple of num_attention_heads {q_heads}; give head_dim",
                    path=where, field="head_dim",
                )
            head_dim = hidden // q_heads

    raw_dtype = cfg.get("torch_dtype", cfg.get("dtype"))
    if raw_dtype is None:
        nbytes: int | Fraction = DTYPES["bf16"]
    else:
        canonical = _dtype_name(raw_dtype)
        if canonical is None:
            raise KvtraceError(f"unknown dtype {raw_dtype!r}", path=where, field="torch_dtype")
        nbytes = DTYPES[canonical]

    if active_params is None:
        active_params = _estimate_active_params(cfg, where, attention=attention, head_dim=head_dim)

    try:
        return ModelSpec(
            name=name or p.resolve().parent.name or "custom",
            attention=attention, layers=layers, q_heads=q_heads, kv_heads=kv_heads,
            head_dim=head_dim, kv_lora_rank=kv_lora_rank, rope_dim=rope_dim,
            active_params=active_params, dtype_bytes=nbytes,
        )
    except KvtraceError as exc:
        raise KvtraceError(exc.message, path=where, field=exc.field) from None


def _estimate_active_params(cfg: dict, where: str, *, attention: str, head_dim: int) -> float:
    why = " (needed to estimate active parameters; pass active_params to skip)"
    hidden = _cfg_int(cfg, "hidden_size", where, why=why)
    vocab = _cfg_int(cfg, "vocab_size", where, why=why)
    layers = _cfg_int(cfg, "num_hidden_layers", where)
    heads = _cfg_int(cfg, "num_attention_heads", where)
    tied = bool(cfg.get("tie_word_embeddings", True))
    embedding = vocab * hidden * (1 if tied else 2)

    if attention == "mla":
        rope = _cfg_int(cfg, "qk_rope_head_dim", where)
        nope = _cfg_int(cfg, "qk_nope_head_dim", where)
        v_dim = _cfg_int(cfg, "v_head_dim", where, default=nope)
        kv_rank = _cfg_int(cfg, "kv_lora_rank", where)
        q_rank = _cfg_int(cfg, "q_lora_rank", where, default=0)
        q_proj = hidden * q_rank + q_rank * heads * head_dim if q_rank else hidden * heads * head_dim
        attn = q_proj + hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim) + heads * v_dim * hidden
    else:
        kv_heads = _cfg_int(cfg, "num_key_value_heads", where, default=heads)
        attn = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim

    n_experts = next((_cfg_int(cfg, k, where) for k in ("n_routed_experts", "num_experts", "num_local_experts")
                      if cfg.get(k)), 0)
    dense_mlp = 0
    moe_mlp = 0
    if n_experts:
        top_k = _cfg_int(cfg, "num_experts_per_tok", where, why=why)
        expert_ff = _cfg_int(cfg, "moe_intermediate_size", where, default=None)
        if expert_ff is None:  # Mixtral: experts use intermediate_size
            expert_ff = _cfg_int(cfg, "intermediate_size", where, why=why)
        shared_ff = (_cfg_int(cfg, "n_shared_experts", where, default=0) * expert_ff
                     + _cfg_int(cfg, "shared_expert_intermediate_size", where, default=0))
        moe_mlp = 3 * hidden * (top_k * expert_ff + shared_ff) + hidden * n_experts
    first_dense = _cfg_int(cfg, "first_k_dense_replace", where, default=0)
    freq = _cfg_int(cfg, "moe_layer_freq", where, default=1) or 1
    step = _cfg_int(cfg, "decoder_sparse_step", where, default=1) or 1
    mlp_only = set(cfg.get("mlp_only_layers") or ())

    def is_moe(i: int) -> bool:
        # DeepSeek counts layers from 0 with moe_layer_freq; Qwen MoE from 1 with
        # decoder_sparse_step. Both default to every layer.
        return (bool(n_experts) and i >= first_dense and i % freq == 0
                and (i + 1) % step == 0 and i not in mlp_only)

    n_moe = sum(is_moe(i) for i in range(layers))
    if n_moe < layers:
        dense_mlp = 3 * hidden * _cfg_int(cfg, "intermediate_size", where, why=why)
    total = embedding + layers * attn + n_moe * moe_mlp + (layers - n_moe) * dense_mlp
    return float(total)


# --------------------------------------------------------------------------- resolve


def resolve_model(
    spec: str | os.PathLike | None = None,
    *,
    dtype: str | None = None,
    kv_bytes_per_token: int | None = None,
) -> ModelSpec:
    """The model named on a command line: a preset name or a ``config.json`` path.

    Parameters
    ----------
    spec : str or path-like, optional
        A preset name or alias (case-insensitive, see :data:`MODELS`), or a path to a
        ``config.json`` or a directory holding one. An existing path wins over a
        preset of the same name. Default :data:`DEFAULT_MODEL`.
    dtype : str, optional
        KV-cache dtype (see :data:`DTYPES`); default: the preset's (16-bit) or the
        config's ``torch_dtype``.
    kv_bytes_per_token : int, optional
        Bytes per token to use instead of the formula (wins over ``dtype``).

    Returns
    -------
    ModelSpec

    Raises
    ------
    UsageError
        Unknown preset (the message lists close matches), unknown dtype, or a
        non-positive ``kv_bytes_per_token``.
    KvtraceError
        An unreadable or incomplete ``config.json``.
    """
    if spec is None:
        model = MODELS[DEFAULT_MODEL]
    elif Path(spec).expanduser().exists():
        model = load_hf_config(spec)
    else:
        text = str(spec)
        canonical = MODELS.canonical(text)  # type: ignore[attr-defined]
        if canonical is None:
            # Something that can only be a path gets a file error, not preset advice.
            if text.endswith(".json") or text.startswith(("/", "./", "../", "~")) or "\\" in text:
                raise KvtraceError("no such file (expected a config.json or a directory holding one)", path=text)
            close = MODELS.close_matches(text)  # type: ignore[attr-defined]
            hint = f"did you mean {', '.join(close)}?" if close else f"known presets: {', '.join(MODELS)}"
            raise UsageError(
                f"unknown model '{text}' (no preset and no such file or directory); {hint}; "
                "or give a path to a Hugging Face config.json",
                field="model",
            )
        model = MODELS[canonical]
    if dtype is not None:
        try:
            model = model.with_dtype(dtype)
        except KvtraceError as exc:
            raise UsageError(exc.message, field="dtype") from None
    if kv_bytes_per_token is not None:
        ok = isinstance(kv_bytes_per_token, (int, np.integer)) and not isinstance(kv_bytes_per_token, bool)
        if not ok or kv_bytes_per_token <= 0:
            raise UsageError(f"expected a positive integer, got {kv_bytes_per_token!r}", field="kv_bytes_per_token")
        model = dataclasses.replace(model, kv_bytes_per_token_override=int(kv_bytes_per_token))
    return model


# --------------------------------------------------------------------------- tables


def attention_family(m: "ModelSpec") -> str:
    """``mha``, ``gqa``, ``mqa`` or ``mla``: how the model's query heads share KV heads
    (``ModelSpec.attention`` only tells the cache layout: ``mha`` covers the first three)."""
    if m.attention == "mla":
        return "mla"
    if m.kv_heads == m.q_heads:
        return "mha"
    return "mqa" if m.kv_heads == 1 else "gqa"


def models_table(block_tokens: int = 512) -> pl.DataFrame:
    """The preset models as a table (``kvtrace models``).

    Parameters
    ----------
    block_tokens : int
        Tokens per block for the ``bytes_per_block`` column.

    Returns
    -------
    polars.DataFrame
        One row per preset: ``name`` str · ``attention`` str (the family: "mha"
        when every query head has its own KV head, "gqa" when groups of query heads
        share one, "mqa" when all share one, "mla" for latent attention; see
        :func:`attention_family`) ·
        ``layers``, ``q_heads``, ``kv_heads``, ``head_dim`` int64 · ``dtype`` str
        (element width) · ``kv_bytes_per_token`` int64 (bytes) · ``bytes_per_block``
        int64 (bytes per full block) · ``active_params`` float64 (parameters).
    """
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, (int, np.integer)) or block_tokens <= 0:
        raise UsageError(f"expected a positive integer, got {block_tokens!r}", field="block_tokens")
    rows = [
        {
            "name": m.name, "attention": attention_family(m), "layers": m.layers, "q_heads": m.q_heads,
            "kv_heads": m.kv_heads, "head_dim": m.head_dim, "dtype": m.dtype,
            "kv_bytes_per_token": m.kv_bytes_per_token,
            "bytes_per_block": m.bytes_per_block(int(block_tokens)),
            "active_params": m.active_params,
        }
        for m in MODELS.values()
    ]
    schema = {"name": pl.String, "attention": pl.String, "layers": pl.Int64, "q_heads": pl.Int64,
              "kv_heads": pl.Int64, "head_dim": pl.Int64, "dtype": pl.String,
              "kv_bytes_per_token": pl.Int64, "bytes_per_block": pl.Int64, "active_params": pl.Float64}
    return pl.DataFrame(rows, schema=schema)
