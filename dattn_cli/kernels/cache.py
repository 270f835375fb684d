"""Bounded, thread-safe LRU cache of planned patterns.

Key: (pair, N, H, semantics, device) — one entry per dilated pair, so patterns that share pairs share
entries. Value: that pair's blocks and any index tensors planned for them. Size from
DATTN_PATTERN_CACHE_SIZE (entries, default 256).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch

DEFAULT_ENTRIES = 256


def _value_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(_value_bytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    if hasattr(value, "as_tuple"):  # FlexAttention's BlockMask: its index tensors
        return _value_bytes(value.as_tuple())
    if isinstance(value, (list, tuple)):
        return sum(_value_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_value_bytes(v) for v in value.values())
    return 0


class PatternCache:
    def __init__(self, max_entries: int | None = None):
        env = os.environ.get("DATTN_PATTERN_CACHE_SIZE")
        self.max_entries = max_entries if max_entries is not None else int(env) if env else DEFAULT_ENTRIES
        if self.max_entries < 1:
            raise ValueError(
                f"pattern cache size must be >= 1, got {self.max_entries}: set DATTN_PATTERN_CACHE_SIZE >= 1"
            )
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self.reset_stats()

    def reset_stats(self) -> None:
        self.hits = self.misses = self.evictions = 0

    def __deepcopy__(self, memo):  # a shared resource: copies of a module share it
        return self

    def __reduce__(self):  # pickled modules re-attach to this process's global cache
        return (get_global_pattern_cache, ())

    def get_or_build(self, key: Hashable, build: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key][0]
            self.misses += 1
        value = build()  # outside the lock: planning may be slow; a racing duplicate build is harmless
        size = _value_bytes(value)
        with self._lock:
            if key not in self._entries:
                self._entries[key] = (value, size)
                self._bytes += size
                while len(self._entries) > self.max_entries:
                    _, (_, old_size) = self._entries.popitem(last=False)
                    self._bytes -= old_size
                    self.evictions += 1
            return self._entries[key][0]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict[str, float]:
        with self._lock:
            lookups = self.hits + self.misses
            return {
                "hits": self.hits,
                "misses": self.misses,
                "evictions": self.evictions,
                "hit_rate": self.hits / lookups if lookups else 0.0,
                "entries": len(self._entries),
                "bytes": self._bytes,
                "max_entries": self.max_entries,
            }


_GLOBAL_CACHE = PatternCache()


def get_global_pattern_cache() -> PatternCache:
    return _GLOBAL_CACHE


def reset_global_pattern_cache() -> None:
    _GLOBAL_CACHE.clear()
    _GLOBAL_CACHE.reset_stats()
