"""The Sizing page's form: a sizing config as the text of its fields and back, an
uploaded ``tiers.toml``, the candidates of one lens. No Streamlit here; the keys and
their kinds are the sizing module's own (:func:`sizing_fields`).
"""

from __future__ import annotations

import polars as pl

from kvtrace.analyses.sizing import SECTIONS, TIER_KEYS, TIERS, SizingConfig, config_from_toml
from kvtrace.errors import KvtraceError


def sizing_fields() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The TOML layout a sizing config is written in, with each value's kind.

    Returns ``({section: {key: kind}}, {tier key: kind})``; kinds are those of
    :mod:`kvtrace.analyses.sizing` (``str``, ``int``, ``size``, ``size0``, ``money``,
    ``positive``, ``nonneg``, ``fraction``, ``share``, ``strlist``). Read from the
    sizing module's own key tables, so the dashboard's form has exactly the keys
    ``kvtrace size --config`` accepts.
    """
    sections = {sec: {k: kind for k, (_attr, kind) in keys.items()} for sec, keys in SECTIONS.items()}
    tiers = {k: spec[1] for k, spec in TIER_KEYS.items()}
    return sections, tiers


def _field_text(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v)
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)
    return str(v)


def sizing_form_values(config: SizingConfig) -> dict[str, str]:
    """A sizing config as form text: ``{"section.key": text}`` and
    ``{"tiers.NAME.key": text}`` for every key of :func:`sizing_fields` (unset: "")."""
    sections, tier_keys = sizing_fields()
    d = config.to_dict()
    out = {f"{sec}.{k}": _field_text(d.get(sec, {}).get(k)) for sec, keys in sections.items() for k in keys}
    for tier in TIERS:
        body = d.get("tiers", {}).get(tier, {})
        out.update({f"tiers.{tier}.{k}": _field_text(body.get(k)) for k in tier_keys})
    return out


def _parse_field(text: str, kind: str, key: str, source: str):
    t = text.strip()
    if kind in ("str", "size", "size0"):
        return t
    if kind == "strlist":
        return [x.strip() for x in t.split(",") if x.strip()]
    try:
        return int(t) if kind == "int" else float(t)
    except ValueError:
        what = "an integer" if kind == "int" else "a number"
        raise KvtraceError(f"expected {what}, got '{t}'", path=source, field=key) from None


def sizing_config_from_form(values: dict[str, str], tiers: tuple[str, ...] = TIERS,
                            source: str = "the form") -> SizingConfig:
    """Build and validate a :class:`kvtrace.analyses.sizing.SizingConfig` from form text.

    Parameters
    ----------
    values : dict
        ``"section.key"`` / ``"tiers.NAME.key"`` -> text; empty text leaves a key out
        (its default applies), as a commented-out line in the TOML would.
    tiers : tuple of str
        The tiers to include (``dram`` is always required).
    source : str
        Name used in error messages.

    Raises
    ------
    KvtraceError
        One line naming the key and what was expected (the sizing module's checks).
    """
    sections, tier_keys = sizing_fields()
    d: dict = {}
    for sec, keys in sections.items():
        body = {}
        for k, kind in keys.items():
            text = values.get(f"{sec}.{k}", "")
            if str(text).strip():
                body[k] = _parse_field(str(text), kind, f"{sec}.{k}", source)
        d[sec] = body
    d["tiers"] = {}
    for tier in TIERS:
        if tier not in tiers:
            continue
        body = {}
        for k, kind in tier_keys.items():
            text = values.get(f"tiers.{tier}.{k}", "")
            if str(text).strip():
                body[k] = _parse_field(str(text), kind, f"tiers.{tier}.{k}", source)
        d["tiers"][tier] = body
    return SizingConfig.from_dict(d, source=source)


def sizing_config_from_toml(name: str, data: bytes) -> SizingConfig:
    """Parse an uploaded ``tiers.toml`` (one-line :class:`KvtraceError` naming ``name``)."""
    return config_from_toml(data, name)


def sizing_table(result, lens: str) -> pl.DataFrame:
    """One lens of :attr:`SizingResult.candidates`, ranked, with the columns the
    dashboard shows (the library's values, unformatted)."""
    cols = ["rank", "candidate", "config", "policy", "dram_prefix_token_hit_rate", "ssd_prefix_token_hit_rate",
            "service_time_mean_ms", "service_time_p99_ms", "cost_usd_per_month",
            "net_usd_per_month", "break_even_realisation", "loaded_ttft_p99_ms", "load_headroom_factor",
            "headroom_bottleneck", "feasible", "reasons"]
    c = result.candidates
    return c.filter(pl.col("lens") == lens).sort("rank").select([x for x in cols if x in c.columns])
