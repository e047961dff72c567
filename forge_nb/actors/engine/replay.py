"""A version's weights copied into vLLM's plain parameters by replaying what the model's own load did.

With plain CPU weights (:mod:`forge_nb.actors.engine.plain`) a version loads through the model's
``load_weights``: checkpoint names mapped to vLLM's parameters (q, k and v into one ``qkv_proj``, gate and up
into ``gate_up_proj``, the vocabulary padded), by Python per tensor. For the tiny model that is 1.1-1.3 ms a
version alone and ~2 ms on the quickstart's busy cores, every training step. What it does with a
version's tensors is the same each time: copy a slice of each into a slice of a parameter, fill the
padding. So the first load runs it under a ``TorchFunctionMode`` that records each ``copy_`` (the destination
view, the source as a strided view of a named tensor of the version) and each ``fill_`` with a number; later
versions with the same names, dtypes and shapes replay those (0.24 ms alone on the tiny model).

A load is recorded only when it did nothing else to a tensor: any operation outside views, sizes and those
two (a dtype conversion, arithmetic, a copy from a tensor that is not a view of the version's, indexing
with a tensor) means the model is left to its ``load_weights`` on every version. A replay first checks that
each parameter it writes still has the storage it had when recorded (vLLM never swaps a plain parameter's
storage, but a replay into a dropped one would load nothing), and records again otherwise.

Considered: a table of vLLM's name mappings per architecture (``stacked_params_mapping``): every model class
has its own, and padding and tied embeddings are per layer type; the model's own loader, watched once,
covers whatever the model does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

#: Operations a load may do without stopping the recording: views and sizes, which write nothing.
_HARMLESS = frozenset({
    "__get__", "narrow", "__getitem__", "size", "numel", "dim", "view", "select", "chunk", "split", "t",
    "transpose", "stride", "storage_offset", "is_contiguous", "data_ptr", "element_size", "__len__",
    "unbind", "expand", "squeeze", "unsqueeze", "__format__", "__repr__",
})


def signature(state_dict: dict[str, torch.Tensor]) -> tuple:
    """What a recorded load depends on: the version's names, dtypes and shapes."""
    return tuple(sorted((name, t.dtype, tuple(t.shape)) for name, t in state_dict.items()))


class Replay:
    """The copies and fills one recorded ``load_weights`` made, to repeat on a version of the same shape."""

    def __init__(self, key: tuple, ops: list[tuple], written: list[tuple[torch.Tensor, int]]):
        self.key = key
        self.ops = ops  # ("copy", destination, name, size, stride, offset) or ("fill", destination, value)
        self._written = written  # (a parameter the ops write into, its storage's address when recorded)

    def fits(self, state_dict: dict[str, torch.Tensor]) -> bool:
        return signature(state_dict) == self.key and all(
            p.untyped_storage().data_ptr() == address for p, address in self._written)

    def load(self, state_dict: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for op in self.ops:
                if op[0] == "copy":
                    _, destination, name, size, stride, offset = op
                    source = state_dict[name]
                    destination.copy_(source.as_strided(size, stride, source.storage_offset() + offset))
                else:
                    op[1].fill_(op[2])


def load(model: Any, state_dict: dict[str, torch.Tensor], replay: Replay | None) -> Replay | None:
    """Load ``state_dict`` into ``model`` (vLLM's, plain weights): by ``replay`` when it fits, else by the
    model's ``load_weights``, recorded. Returns the replay for the next version (None: not replayable)."""
    if replay is not None and replay.fits(state_dict):
        replay.load(state_dict)
        return replay
    recorder = _Recorder(state_dict)
    with recorder:
        model.load_weights(weights=iter(state_dict.items()))
    return recorder.replay(model)


class _Recorder(TorchFunctionMode):
    def __init__(self, state_dict: dict[str, torch.Tensor]):
        super().__init__()
        self._state_dict = state_dict
        # (start, end, name) of each contiguous source: where a copy's source lies tells which tensor it views
        self._spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), name)
                       for name, t in state_dict.items() if t.is_contiguous()]
        self._ops: list[tuple] = []
        self._refused: str | None = None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self._refused is None:
            if name == "copy_" and len(args) == 2 and not kwargs:
                self._record_copy(*args)
            elif name == "fill_" and len(args) == 2 and isinstance(args[1], int | float) and not kwargs:
                self._ops.append(("fill", args[0], args[1]))
            elif name not in _HARMLESS:
                self._refused = name
        return func(*args, **kwargs)

    def _record_copy(self, destination: torch.Tensor, source: Any) -> None:
        if not isinstance(source, torch.Tensor):
            self._refused = "copy_ from a non-tensor"
            return
        address = source.data_ptr()
        for start, end, name in self._spans:
            base = self._state_dict[name]
            if start <= address < end and source.dtype == base.dtype:
                offset, rest = divmod(address - start, base.element_size())
                last = offset + sum((n - 1) * s for n, s in zip(source.shape, source.stride(), strict=True))
                if rest == 0 and last < base.numel():
                    self._ops.append(("copy", destination, name, tuple(source.shape), source.stride(), offset))
                    return
        self._refused = "copy_ from a tensor that is not a view of the version's"

    def replay(self, model: torch.nn.Module) -> Replay | None:
        """What was recorded, if it can be replayed: every write lands in one of the model's tensors."""
        if self._refused is not None or not self._ops:
            return None
        owners = {t.untyped_storage().data_ptr(): t for t in (*model.parameters(), *model.buffers())}
        written = {op[1].untyped_storage().data_ptr() for op in self._ops}
        if not written <= owners.keys():
            return None
        return Replay(signature(self._state_dict), self._ops, [(owners[address], address) for address in written])
