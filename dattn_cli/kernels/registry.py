"""The one registry of implementations, and the factories that read it.

Adding an implementation = one module + one `register(...)` line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from .dilated import DilatedAttention, ImprovedDilatedAttention
from .distributed.allgather import DistributedImprovedDilatedAttention
from .block_sparse.attention import BlockSparseRingDilatedAttention
from .distributed.head_parallel import HeadParallelDilatedAttention
from .multihead import (
    BlockSparseRingMultiheadDilatedAttention,
    ImprovedMultiheadDilatedAttention,
    MultiheadDilatedAttention,
    RingMultiheadDilatedAttention,
)
from .distributed.ring import RingDilatedAttention


@dataclass(frozen=True)
class Implementation:
    name: str
    cls: type[nn.Module]
    kind: Literal["core", "multihead"]
    summary: str
    distributed: bool = False  # runs sharded over a process group (verify/bench run it in spawned groups)
    block_sparse: bool = False  # takes pattern options (pattern, block_size, window, density, ...)
    single_device: bool | None = None  # also a plain single-device module; default: not distributed

    def __post_init__(self):
        if self.single_device is None:
            object.__setattr__(self, "single_device", not self.distributed)


REGISTRY: dict[str, Implementation] = {}


def register(impl: Implementation) -> Implementation:
    REGISTRY[impl.name] = impl
    return impl


register(Implementation("DilatedAttention", DilatedAttention, "core", "gather by index, backend per block, exact LSE merge"))
register(Implementation("ImprovedDilatedAttention", ImprovedDilatedAttention, "core", "strided views, pattern cache, memory pool"))
register(Implementation("MultiheadDilatedAttention", MultiheadDilatedAttention, "multihead", "projections around DilatedAttention"))
register(
    Implementation(
        "ImprovedMultiheadDilatedAttention", ImprovedMultiheadDilatedAttention, "multihead",
        "projections around ImprovedDilatedAttention",
    )
)
register(
    Implementation(
        "RingDilatedAttention", RingDilatedAttention, "core",
        "contiguous shards; sparsified K/V rotated around each segment's ranks", distributed=True,
    )
)
register(
    Implementation(
        "RingMultiheadDilatedAttention", RingMultiheadDilatedAttention, "multihead",
        "projections around RingDilatedAttention", distributed=True,
    )
)
register(
    Implementation(
        "DistributedImprovedDilatedAttention", DistributedImprovedDilatedAttention, "core",
        "contiguous shards; sparsified K/V all-gathered within each segment's ranks (LongNet)", distributed=True,
    )
)
register(
    Implementation(
        "HeadParallelDilatedAttention", HeadParallelDilatedAttention, "core",
        "all-to-all sequence shards -> head shards, dilated attention on H/p heads, all-to-all back", distributed=True,
    )
)


register(
    Implementation(
        "BlockSparseRingDilatedAttention", BlockSparseRingDilatedAttention, "core",
        "block patterns (local, dilated, global_local, hierarchical, longnet) on FlexAttention or gathered key blocks; "
        "ring form sends only used key blocks", distributed=True, single_device=True, block_sparse=True,
    )
)
register(
    Implementation(
        "BlockSparseRingMultiheadDilatedAttention", BlockSparseRingMultiheadDilatedAttention, "multihead",
        "projections around BlockSparseRingDilatedAttention", distributed=True, single_device=True, block_sparse=True,
    )
)


def get_implementation(name: str) -> Implementation:
    if name not in REGISTRY:
        raise ValueError(f"unknown implementation {name!r}: use one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def _choose(kind: str, wanted: Literal["core", "multihead"]) -> tuple[Implementation, str]:
    if kind != "auto":
        impl = get_implementation(kind)
        if impl.kind != wanted:
            raise ValueError(f"kind={kind!r} is a {impl.kind} implementation; pick a {wanted} one: "
                             + ", ".join(n for n, i in REGISTRY.items() if i.kind == wanted))
        return impl, f"chosen: {impl.name} (requested)"
    dist = torch.distributed.is_available() and torch.distributed.is_initialized()
    world = torch.distributed.get_world_size() if dist else 1
    candidates = [i for i in REGISTRY.values() if i.kind == wanted and (i.distributed if world > 1 else i.single_device)]
    if not candidates:
        candidates = [i for i in REGISTRY.values() if i.kind == wanted and i.single_device]
        why = f"world size {world} but no distributed {wanted} implementation is registered, so single-device"
    else:
        why = f"world size {world}"
    preferred = [i for i in candidates if i.name.startswith(("Improved", "Ring"))] or candidates
    impl = preferred[0]
    return impl, f"auto chose {impl.name} ({why}; {impl.summary})"


def create_dilated_attention(kind: str = "auto", **cfg: Any) -> nn.Module:
    """Build a core implementation by registry name, or `auto` (see `module.describe()`)."""
    impl, why = _choose(kind, "core")
    module = impl.cls(**cfg)
    module.selection_reason = why
    return module


def create_multihead_dilated_attention(kind: str = "auto", **cfg: Any) -> nn.Module:
    """Build a multihead implementation by registry name, or `auto` (see `module.describe()`)."""
    impl, why = _choose(kind, "multihead")
    module = impl.cls(**cfg)
    module.attention.selection_reason = why
    return module
