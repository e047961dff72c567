"""The machinery of the YAML reader: sections checked against what they accept, and a tree that knows who set what.

``section`` refuses an unknown key naming its dotted path, the keys accepted there, and the closest one;
``same`` accepts a key that states what forge_nb does anyway at that value only; ``Tree`` builds RunConfig's
data and refuses two keys that set one field to different values.
"""

from __future__ import annotations

import difflib
from typing import Any


def section(value: Any, where: str, accepted: Any, refused: dict[str, str] | None = None) -> dict[str, Any]:
    """``value`` as a mapping whose keys are all ``accepted``; else a ValueError naming the dotted key."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}={value!r}: expected a mapping of keys to values")
    names = sorted(accepted)
    for key in value:
        dotted = f"{where}.{key}" if where else str(key)
        if refused and key in refused:
            raise ValueError(f"{dotted}: {refused[key]}")
        if key not in accepted:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            kind, place = ("key(s)", f"under {where!r}") if where else ("top-level key(s)", "at the top level")
            raise ValueError(f"unknown {kind} [{dotted!r}]{hint}; accepted {place}: {', '.join(names)}")
    return value


def same(key: str, value: Any, expected: Any, why: str) -> None:
    """Accept a key that states what forge_nb does anyway, at that value only."""
    if value != expected:
        raise ValueError(f"{key}={value!r}: {why}; remove it or set it to {expected!r}")


def model_name(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{key}={value!r}: a hub id ('Qwen/Qwen3-1.7B') or a local model folder")
    return value.removeprefix("hf://")


def number(value: Any, key: str, kind: type = float) -> Any:
    """``value`` as a float (or int), or a ValueError naming the key."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}={value!r}: must be a number") from None


class AnyKey:
    """Accepts every key: a section passed on to a library that checks it (vLLM, an exporter)."""

    def __iter__(self) -> Any:
        return iter(())

    def __contains__(self, key: object) -> bool:
        return True


class Tree:
    """RunConfig's data being built from YAML keys, remembering which key set each field."""

    def __init__(self) -> None:
        self.out: dict[str, Any] = {}
        self.source: dict[str, str] = {}

    def put(self, path: str, value: Any, key: str) -> None:
        *parents, last = path.split(".")
        node = self.out
        for part in parents:
            node = node.setdefault(part, {})
        if path in self.source and node[last] != value:
            raise ValueError(f"{key}={value!r} and {self.source[path]}={node[last]!r} both set {path}; keep one")
        node[last] = value
        self.source.setdefault(path, key)

    def put_tree(self, path: str, value: Any, key: str) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                self.put_tree(f"{path}.{k}", v, f"{key}.{k}")
        elif isinstance(value, dict):
            *parents, last = path.split(".")
            node = self.out
            for part in parents:
                node = node.setdefault(part, {})
            node.setdefault(last, {})
        else:
            self.put(path, value, key)

    def get(self, path: str, default: Any = None) -> Any:
        node: Any = self.out
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node
