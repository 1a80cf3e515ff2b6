"""``Stateful`` (torch/distributed/checkpoint/stateful.py): an object with ``state_dict`` / ``load_state_dict``
(a module, an optimizer, an app's own wrapper) may stand in a checkpointed dict; save calls ``state_dict()``,
load loads into that and hands it back through ``load_state_dict``."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["Stateful", "StatefulT"]


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


StatefulT = TypeVar("StatefulT", bound=Stateful)
