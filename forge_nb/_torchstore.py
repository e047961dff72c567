"""torchstore 0.1.2 on monarch 0.7: the compatibility binding, applied when this module is imported.

torchstore's ``Controller`` actor mixes ``def`` and ``async def`` endpoints, which monarch >= 0.3
refuses (``ValueError: ... mixes both async and sync endpoints``). We subclass it with every
endpoint made async and bind the subclass where torchstore looks it up (``torchstore.api``).
The controller class travels between processes by reference, so the binding must exist in every
process that uses torchstore: import torchstore through this module, never directly
(``from forge_nb._torchstore import ts``). Importing it imports monarch, so the kernel calls
``forge_nb.runtime.ensure_started()`` first; spawned procs inherit its environment.
"""

import torchstore as ts
import torchstore.api
from torchstore.controller import Controller as _TorchstoreController

from forge_nb._monarch_compat import async_endpoints


@async_endpoints
class Controller(_TorchstoreController):
    """torchstore's controller with async-only endpoints (same names and signatures)."""


torchstore.api.Controller = Controller

__all__ = ["Controller", "ts"]
