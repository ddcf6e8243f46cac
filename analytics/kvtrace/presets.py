"""Named presets: a read-only mapping with case-insensitive, alias-aware lookup, and the
number check the spec dataclasses share (:mod:`kvtrace.model`, :mod:`kvtrace.gpu`)."""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["Presets", "is_real", "normalize_name"]


def is_real(value: Any) -> bool:
    """A real number that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def normalize_name(name: str) -> str:
    """The lookup key of a preset name.

    Accepts Hugging Face repo ids and Ollama tags: drops the organisation, case, and the
    tuning suffixes that do not change the architecture.
    """
    key = str(name).strip().lower().rstrip("/").split("/")[-1]
    key = key.replace("_", "-").replace(" ", "-").replace(":", "-")
    parts = [p for p in key.split("-") if p and p not in {"instruct", "chat", "base", "hf", "nvidia"}]
    if len(parts) > 1 and parts[0] == "meta":
        parts = parts[1:]
    return "-".join(parts)


class Presets(Mapping):
    """Read-only mapping of canonical name -> spec with case-insensitive, alias-aware lookup."""

    def __init__(self, specs: dict[str, Any], aliases: dict[str, tuple[str, ...]]) -> None:
        self._specs = dict(specs)
        self._keys: dict[str, str] = {}
        for canonical in specs:
            for alias in (canonical, *aliases.get(canonical, ())):
                key = normalize_name(alias)
                if self._keys.get(key, canonical) != canonical:
                    raise ValueError(f"alias {alias!r} is ambiguous")
                self._keys[key] = canonical

    def canonical(self, name: str) -> str | None:
        """The canonical name ``name`` refers to, or None."""
        return self._keys.get(normalize_name(name))

    def close_matches(self, name: str, n: int = 3) -> list[str]:
        """Canonical names that look like ``name`` (for error messages)."""
        hits = difflib.get_close_matches(normalize_name(name), list(self._keys), n=2 * n, cutoff=0.5)
        return list(dict.fromkeys(self._keys[h] for h in hits))[:n]

    def __getitem__(self, name: str):
        canonical = self.canonical(name)
        if canonical is None:
            raise KeyError(name)
        return self._specs[canonical]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self._specs)})"
