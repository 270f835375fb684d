"""A bounded, thread-safe pool of scratch buffers keyed by (shape, dtype, device).

`acquire` hands out a buffer no other caller holds (a free one of that key, or a new one); `release`
returns it. Free buffers beyond `max_bytes` are dropped, oldest first, so the pool never grows without
bound. Contents of an acquired buffer are undefined.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import torch

DEFAULT_MAX_BYTES = 1 << 30


def _key(shape, dtype, device) -> tuple:
    return (tuple(shape), dtype, str(torch.device(device)))


class MemoryPool:
    def __init__(self, max_bytes: int | None = None):
        env = os.environ.get("DATTN_MEMORY_POOL_BYTES")
        self.max_bytes = max_bytes if max_bytes is not None else int(env) if env else DEFAULT_MAX_BYTES
        self._lock = threading.Lock()
        self._free: OrderedDict[int, tuple[tuple, torch.Tensor]] = OrderedDict()
        self._free_bytes = 0
        self._lent_bytes = 0
        self.reset_stats()

    def __deepcopy__(self, memo):  # a shared resource: copies of a module share it
        return self

    def __reduce__(self):  # pickled modules re-attach to this process's global pool
        return (get_global_memory_pool, ())

    def reset_stats(self) -> None:
        self.requests = 0
        self.reuses = 0
        self.peak_bytes_held = 0

    def acquire(self, shape, dtype: torch.dtype, device) -> torch.Tensor:
        key = _key(shape, dtype, device)
        with self._lock:
            self.requests += 1
            for ident, (k, buf) in self._free.items():
                if k == key:
                    del self._free[ident]
                    self._free_bytes -= _nbytes(buf)
                    self._lent_bytes += _nbytes(buf)
                    self.reuses += 1
                    return buf
        buf = torch.empty(shape, dtype=dtype, device=device)
        with self._lock:
            self._lent_bytes += _nbytes(buf)
            self._note_peak()
        return buf

    def release(self, buf: torch.Tensor) -> None:
        with self._lock:
            self._lent_bytes -= _nbytes(buf)
            if _nbytes(buf) > self.max_bytes:
                return
            self._free[id(buf)] = (_key(buf.shape, buf.dtype, buf.device), buf)
            self._free_bytes += _nbytes(buf)
            while self._free_bytes > self.max_bytes:
                _, (_, old) = self._free.popitem(last=False)
                self._free_bytes -= _nbytes(old)
            self._note_peak()

    def _note_peak(self) -> None:
        self.peak_bytes_held = max(self.peak_bytes_held, self._free_bytes + self._lent_bytes)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._free_bytes = 0

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {
                "requests": self.requests,
                "reuses": self.reuses,
                "reuse_rate": self.reuses / self.requests if self.requests else 0.0,
                "bytes_held": self._free_bytes + self._lent_bytes,
                "bytes_free": self._free_bytes,
                "peak_bytes_held": self.peak_bytes_held,
                "max_bytes": self.max_bytes,
            }


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


_GLOBAL_POOL = MemoryPool()


def get_global_memory_pool() -> MemoryPool:
    return _GLOBAL_POOL


def reset_global_memory_pool() -> None:
    _GLOBAL_POOL.clear()
    _GLOBAL_POOL.reset_stats()
