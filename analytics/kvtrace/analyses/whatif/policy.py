"""The flash admission policies of a what-if: their grammar (:func:`parse_policy`) and
parsed form (:class:`Policy`). Their semantics are the tier simulator's
(:mod:`kvtrace.kernels.tiers`, "Writes and admission") and the package docstring's."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvtrace.analyses.curves import GROUPINGS
from kvtrace.errors import UsageError
from kvtrace.kernels import tiers as K
from kvtrace.units import parse_duration


@dataclass(frozen=True)
class Policy:
    """A parsed admission policy.

    Attributes
    ----------
    kind : str
        ``all``, ``none``, ``freq``, ``prob``, ``idle``, ``value``, ``reuse-oracle``,
        ``tinylfu`` or ``group``.
    param : float
        k (freq, accesses), p (prob, probability), T (idle, seconds), v (value, $),
        threshold (group, probability); 0 otherwise.
    by : str or None
        Grouping of the ``group`` policy.
    """

    kind: str
    param: float = 0.0
    by: str | None = None

    @property
    def code(self) -> int:
        return {"all": K.P_ALL, "none": K.P_NONE, "freq": K.P_FREQ, "prob": K.P_PROB, "idle": K.P_IDLE,
                "value": K.P_VALUE, "reuse-oracle": K.P_ORACLE, "tinylfu": K.P_TINYLFU,
                "group": K.P_GROUP}[self.kind]

    def __str__(self) -> str:
        if self.kind == "freq":
            return f"freq>={int(self.param)}"
        if self.kind == "prob":
            return f"prob:{self.param:g}"
        if self.kind == "idle":
            return f"idle<{self.param:g}s"
        if self.kind == "value":
            return f"value>={self.param:g}"
        if self.kind == "group":
            return f"group:{self.by}>={self.param:g}"
        return self.kind


_FLOAT = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"


def parse_policy(text: str, *, group_by: str = "type") -> Policy:
    """Parse an admission policy.

    ``all`` · ``none`` · ``freq>=k`` (``second-hit`` = ``freq>=2``) · ``prob:p`` ·
    ``idle<T`` (a duration: ``90s``, ``10min``) · ``value>=v`` ($, may be negative) ·
    ``reuse-oracle`` · ``tinylfu`` · ``group>=p`` / ``group:BY>=p`` (BY in type,
    tenant, turn, session-length; default ``group_by``).

    Each comparison has a spelling a shell leaves alone (``>`` and ``<`` are
    redirections there): ``freq:k``, ``idle:T``, ``value:v``, ``group:p`` and
    ``group:BY:p`` mean the same as the forms above.
    """
    s = str(text).strip().lower().replace(" ", "")
    m = re.fullmatch(r"(freq|idle|value|group(?::[a-z-]+)?):([^:<>=]+)", s)
    if m and not (m.group(1) == "group" and re.fullmatch(r"[a-z-]+", m.group(2))):
        s = m.group(1) + ("<" if m.group(1) == "idle" else ">=") + m.group(2)
    if s in ("all", "admit-all", "always"):
        return Policy("all")
    if s in ("none", "never"):
        return Policy("none")
    if s in ("second-hit", "second_hit"):
        return Policy("freq", 2.0)
    if s in ("reuse-oracle", "oracle"):
        return Policy("reuse-oracle")
    if s == "tinylfu":
        return Policy("tinylfu")
    m = re.fullmatch(r"freq>=([0-9]+)", s)
    if m:
        k = int(m.group(1))
        if k < 1:
            raise UsageError(f"freq>=k needs k >= 1, got '{text}'", field="policy")
        return Policy("freq", float(k))
    m = re.fullmatch(r"prob[:=]" + _FLOAT, s)
    if m:
        p = float(m.group(1))
        if not 0 <= p <= 1:
            raise UsageError(f"prob:p needs p in [0, 1], got '{text}'", field="policy")
        return Policy("prob", p)
    m = re.fullmatch(r"idle<(.+)", s)
    if m:
        return Policy("idle", parse_duration(m.group(1), field="policy"))
    m = re.fullmatch(r"value>=(-?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)", s)
    if m:
        return Policy("value", float(m.group(1)))
    m = re.fullmatch(r"group(?::([a-z-]+))?>=" + _FLOAT, s)
    if m:
        by = m.group(1) or group_by
        if by not in GROUPINGS:
            raise UsageError(f"unknown grouping '{by}' in '{text}': expected one of {', '.join(GROUPINGS)}",
                             field="policy")
        p = float(m.group(2))
        if not 0 <= p <= 1:
            raise UsageError(f"group>=p needs p in [0, 1], got '{text}'", field="policy")
        return Policy("group", p, by)
    raise UsageError(
        f"unknown admission policy '{text}': expected all, none, freq>=k, second-hit, prob:p, idle<T, "
        "value>=v, reuse-oracle, tinylfu or group[:by]>=p (or, safe in a shell, freq:k, idle:T, value:v, "
        "group[:by]:p)",
        field="policy",
    )


__all__ = ["Policy", "parse_policy"]
