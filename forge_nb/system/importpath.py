"""``package.module:Name`` paths, as configs name a loss, a task or an actor class, and optional packages:
imported, or a clear error."""

from __future__ import annotations

import importlib
from typing import Any


def import_path(path: str, *, label: str, where: str = "here") -> Any:
    """The object ``path`` ("package.module:Name", dotted attributes allowed after the colon) names.

    A path that does not import raises ValueError naming ``label`` (e.g. "trainer.loss"), the path,
    ``where`` the import was tried, the reason, and the fix."""
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{label}={path!r}: write it as 'package.module:Name'")
    try:
        found: Any = importlib.import_module(module)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{label}={path!r}: cannot import it {where} ({e}); name an object in an importable "
                         "module (package.module:Name), or pass the object itself") from e
    return found


def require(module: str, *, missing: str) -> Any:
    """The module, imported; when it is not installed, ImportError with ``missing`` (what needs it and the
    command that installs it) and the reason."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{missing} ({e})") from e
