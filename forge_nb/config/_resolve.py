"""OmegaConf-style interpolation for YAML configs: ``${a.b}``, ``${sum:x,y}``, ``${oc.env:NAME,default}``.

torchforge's YAML is read by OmegaConf; forge_nb reads it with PyYAML and resolves the three kinds of
reference its files use here, so no second config library is needed. PyYAML follows YAML 1.1, which
reads ``1e-5`` (no dot) as a string; OmegaConf reads it as a float, and so does :func:`resolve`.
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml

_REF = re.compile(r"\$\{([^${}]+)\}")  # an innermost ${...}
FLOAT = re.compile(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+")


def resolve(node: Any, root: dict[str, Any]) -> Any:
    """``node`` with every ``${...}`` reference into ``root`` replaced by its value."""
    if isinstance(node, dict):
        return {k: resolve(v, root) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, root) for v in node]
    while isinstance(node, str) and "${" in node:
        whole = _REF.fullmatch(node)
        if whole:  # a lone reference keeps its value's type
            return _lookup(whole.group(1), root)
        resolved = _REF.sub(lambda m: str(_lookup(m.group(1), root)), node)
        if resolved == node:
            raise ValueError(f"cannot resolve {node!r}")
        node = resolved
    if isinstance(node, str) and FLOAT.fullmatch(node.strip()):
        return float(node)
    return node


def _lookup(expr: str, root: dict[str, Any]) -> Any:
    if expr.startswith("sum:"):
        return sum(resolve(yaml.safe_load(p), root) for p in expr[4:].split(","))
    if expr.startswith("oc.env:"):
        name, _, default = expr[7:].partition(",")
        return os.environ.get(name, default)
    node: Any = root
    for part in expr.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"${{{expr}}}: no such key in the YAML")
        node = node[part]
    return resolve(node, root)
