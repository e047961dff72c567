"""torchstore 0.1.2 on monarch 0.7: the compatibility binding, applied when this module is imported.

torchstore's ``Controller`` actor mixes ``def`` and ``async def`` endpoints, which monarch >= 0.3
refuses (``ValueError: ... mixes both async and sync endpoints``). We subclass it with every
endpoint made async and bind the subclass where torchstore looks it up (``torchstore.api``).
The controller class travels between processes by reference, so the binding must exist in every
process that uses torchstore: import torchstore through this module, never directly
(``from forge_nb.weights.torchstore import ts``). Importing it imports monarch, so the kernel calls
``forge_nb.system.runtime.lifecycle.ensure_started()`` first; spawned procs inherit its environment.

torchstore also logs through the root logger's module functions (``logging.debug(...)`` on every put,
get and delete). With no handler on the root logger, that runs ``logging.basicConfig()`` in the
kernel, after which every library's warnings print into the cells. Its modules get a stand-in for
``logging`` whose record functions go to the ``torchstore`` logger instead (which a run's kernel.log
records: ``forge_nb.system.processes.proclogs.KernelLog``).
"""

import logging
from typing import Any

import torchstore as ts
import torchstore.api
import torchstore.logging
import torchstore.transport.buffers
from torchstore.controller import Controller as _TorchstoreController

from forge_nb.system.monarch_compat import async_endpoints


@async_endpoints
class Controller(_TorchstoreController):
    """torchstore's controller with async-only endpoints (same names and signatures)."""


torchstore.api.Controller = Controller


class _LoggingModule:
    """Stands in for the ``logging`` module inside torchstore's modules: ``logging.debug(...)`` and the
    other record functions go to the ``torchstore`` logger; everything else is the real module's."""

    _RECORDS = frozenset({"debug", "info", "warning", "error", "exception", "critical", "log"})

    def __init__(self, name: str):
        self._logger = logging.getLogger(name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._logger if attr in self._RECORDS else logging, attr)


for _module in (torchstore.logging, torchstore.transport.buffers):
    _module.logging = _LoggingModule("torchstore")  # type: ignore[attr-defined]

__all__ = ["Controller", "ts"]
