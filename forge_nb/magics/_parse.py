"""Turn magic arguments into what the public API takes: a RunConfig, overrides, hyperparameter changes.

Every mistake becomes a ``UsageError`` whose message says what to write instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from IPython.core.error import UsageError

from forge_nb.system.importpath import import_path

_FLOAT = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)[eE][-+]?\d+")


def yaml_value(raw: str) -> Any:
    """``3e-4`` -> 0.0003, ``true`` -> True, ``[1, 2]`` -> [1, 2], ``abc`` -> "abc" (YAML, plus 1e-5 floats)."""
    value = yaml.safe_load(raw) if raw.strip() else ""
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
    return value


def assignments(items: list[str], example: str) -> dict[str, Any]:
    """``["lr=1e-3", "temperature=0.7"]`` -> {"lr": 0.001, "temperature": 0.7}."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{item!r}: write key=value, e.g. {example}")
        try:
            out[key.strip()] = yaml_value(raw)
        except yaml.YAMLError as e:
            raise UsageError(f"{item!r}: the value is not valid YAML ({e})") from None
    return out


def identifier(name: str, flag: str = "-o") -> str:
    if not name.isidentifier():
        raise UsageError(f"{flag} {name!r}: a variable name is needed (letters, digits and _)")
    return name


def resolve_config(spec: str, user_ns: dict[str, Any]) -> Any:
    """A RunConfig from a recipe name, ``module:function``, a YAML path or a variable holding one."""
    from forge_nb.config import RunConfig, from_yaml

    if spec in user_ns and isinstance(user_ns[spec], RunConfig):
        return user_ns[spec]
    if spec.endswith((".yaml", ".yml")):
        if not Path(spec).is_file():
            raise UsageError(f"{spec!r}: no such YAML file (relative paths start at {str(Path.cwd())!r})")
        return _checked(lambda: from_yaml(Path(spec)), spec)
    if ":" in spec:
        try:
            factory = import_path(spec, label="recipe")
        except ValueError as e:
            raise UsageError(str(e)) from None
        return _as_config(_checked(factory, spec), spec)
    known = _recipes()
    if spec in known:
        return _checked(known[spec], spec)
    if spec in user_ns:
        raise UsageError(f"{spec!r} holds a {type(user_ns[spec]).__name__}, not a RunConfig; build one with "
                         "%%forge_config -o NAME or a recipe (forge_nb.quickstart())")
    raise UsageError(f"unknown recipe {spec!r}. Use a recipe ({', '.join(sorted(known))}), "
                     "'package.module:function' returning a RunConfig, a .yaml path, or a variable holding "
                     "a RunConfig (%%forge_config -o NAME makes one)")


def _recipes() -> dict[str, Any]:
    """Recipe name -> function returning a RunConfig (``forge_nb.recipes.RECIPES``)."""
    from forge_nb import recipes

    table = getattr(recipes, "RECIPES", None)
    return dict(table) if table else {n: getattr(recipes, n) for n in recipes.__all__
                                      if callable(getattr(recipes, n))}


def _checked(make: Any, spec: str) -> Any:
    try:
        return make()
    except ValueError as e:
        raise UsageError(f"{spec}: {e}") from None


def _as_config(value: Any, spec: str) -> Any:
    from forge_nb.config import RunConfig

    if not isinstance(value, RunConfig):
        raise UsageError(f"{spec!r} returned a {type(value).__name__}; a recipe must return a RunConfig")
    return value


def spawn_overrides(replicas: int | None, procs: int | None, gpus: bool, sets: list[str]) -> list[str]:
    """The flags of ``%forge_spawn RECIPE`` as ``key=value`` overrides (``--set`` ones last, so they win)."""
    out = []
    if replicas is not None:
        out.append(f"generator.num_replicas={replicas}")
    if procs is not None:
        out.append(f"generator.procs={procs}")
    if gpus:
        out += ["generator.with_gpus=true", "trainer.with_gpus=true"]
    for item in sets:
        if "=" not in item:
            raise UsageError(f"--set {item!r}: write key=value with a dotted key, e.g. --set trainer.optimizer.lr=1e-5 "
                             "(the recipe comes before --set)")
    return out + sets


def apply(cfg: Any, overrides: list[str]) -> Any:
    from forge_nb.config import apply_overrides

    if not overrides:
        return cfg
    try:
        return apply_overrides(cfg, overrides)
    except ValueError as e:
        raise UsageError(f"{e}") from None


def config_cell(text: str) -> Any:
    """``%%forge_config``: the cell's YAML as a validated RunConfig."""
    from forge_nb.config import from_yaml

    try:
        return from_yaml(text)
    except yaml.YAMLError as e:
        raise UsageError(f"the cell is not valid YAML: {e}") from None
    except ValueError as e:
        raise UsageError(f"config: {e}") from None


SERVICES = ("policy", "trainer", "ref_model")


def actor_classes(items: list[str], user_ns: dict[str, Any]) -> dict[str, type]:
    """``["policy=MyGenerator"]`` -> {"policy": MyGenerator}: a variable or ``package.module:Class``."""
    from forge_nb.service import ForgeActor

    out: dict[str, type] = {}
    for item in items:
        service, sep, spec = (part.strip() for part in item.partition("="))
        if not sep or service not in SERVICES or not spec:
            raise UsageError(f"--actor {item!r}: write SERVICE=CLASS with SERVICE one of {', '.join(SERVICES)}, "
                             "e.g. --actor policy=MyGenerator or --actor policy=my_pkg.actors:MyGenerator")
        if spec in user_ns:
            cls = user_ns[spec]
        elif ":" in spec:
            try:
                cls = import_path(spec, label=f"--actor {service}")
            except ValueError as e:
                raise UsageError(str(e)) from None
        else:
            raise UsageError(f"--actor {item!r}: {spec!r} is neither a variable nor 'package.module:Class'")
        if not (isinstance(cls, type) and issubclass(cls, ForgeActor)):
            raise UsageError(f"--actor {item!r}: {spec!r} is a {type(cls).__name__}, not a ForgeActor subclass")
        out[service] = cls
    return out
