"""Double of ``tensorrt_llm.mapping.Mapping``: parallelism sizes."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Mapping"]


@dataclass
class Mapping:
    world_size: int = 1
    tp_size: int = 1
    pp_size: int = 1

    def has_pp(self) -> bool:
        return self.pp_size > 1
