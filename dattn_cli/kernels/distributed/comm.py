"""What every distributed implementation shares: its group, byte accounting, up-front consistency checks, and
the base class of the distributed modules."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..validation import check_key_padding_mask, check_qkv


def group_rank_size(group) -> tuple[int, int]:
    """(rank, world size) in `group`; (0, 1) when torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


class CommStats:
    """Bytes this rank sent to and received from other ranks, per direction of the pass."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        counts = (f"{phase}_bytes_{way}" for phase in ("forward", "backward") for way in ("sent", "received"))
        self.counts = dict.fromkeys((*counts, "forward_calls"), 0)

    def __getstate__(self):  # copies and pickles of a module carry the counts, not the lock
        return {"counts": self.snapshot()}

    def __setstate__(self, state):
        self._lock = threading.Lock()
        self.counts = dict(state["counts"])

    def add(self, phase: str, sent: int, received: int) -> None:
        with self._lock:
            self.counts[f"{phase}_bytes_sent"] += int(sent)
            self.counts[f"{phase}_bytes_received"] += int(received)

    def call(self) -> None:
        with self._lock:
            self.counts["forward_calls"] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


DEBUG_CONSISTENCY = "DATTN_DEBUG_CONSISTENCY"


def check_consistent(
    group, name: str, shape: tuple, dtype: torch.dtype, config: str, device: torch.device, *, owner: object = None
) -> None:
    """Every rank must call with the same shard shape, dtype and configuration: one small all_gather
    finds a mismatch before any rank enters a collective that would otherwise hang or mix data.

    With `owner` (the calling module) each (group, shape, dtype, config) is checked once, on its first
    call, and remembered on the owner: later calls skip the collective and its host sync. Ranks that all
    move to a new shape are still checked; a rank that alone moves to a new shape while its peers repeat
    a checked one is not (it enters the check's collective alone: a hang until the group's timeout, or a
    collective mismatch). DATTN_DEBUG_CONSISTENCY=1 checks every call.
    """
    _, world = group_rank_size(group)
    if world == 1:
        return
    key = (id(group), tuple(shape), str(dtype), config)  # plain values: a module stays copyable
    seen = None if owner is None else vars(owner).setdefault("_consistent_keys", set())
    if seen is not None and key in seen and os.environ.get(DEBUG_CONSISTENCY) != "1":
        return
    digest = int.from_bytes(hashlib.sha1(f"{tuple(shape)}|{dtype}|{config}".encode()).digest()[:7], "little")
    mine = torch.tensor([digest], dtype=torch.int64, device=device)
    everyone = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=group)
    values = torch.cat(everyone).tolist()  # the one host sync
    if len(set(values)) > 1:
        odd = [r for r, v in enumerate(values) if v != values[0]]
        raise ValueError(
            f"{name}: ranks disagree on shard shape, dtype or configuration (this rank: shape {tuple(shape)}, "
            f"{dtype}, {config}); ranks {odd} differ from rank 0: give every rank the same shapes and settings"
        )
    if seen is not None:
        seen.add(key)


def check_call(module, q: torch.Tensor, k: torch.Tensor, is_causal: bool, key_padding_mask, *extra) -> None:
    """`check_consistent` of one call of a distributed module: its shard shape and dtype, the module's own
    state (`module.signature()`), and the call's causality, kv heads, key mask and `extra` options."""
    config = "|".join(map(str, (module.signature(), bool(is_causal), k.shape[2], key_padding_mask is not None, *extra)))
    name = type(module).__name__
    check_consistent(module.process_group, name, tuple(q.shape), q.dtype, config, q.device, owner=module)


class DistributedAttention(nn.Module):
    """What every distributed module holds: the single-device attention it delegates to (world size 1,
    or the per-rank work), its process group and its byte counts; and the prologue of every call: one rank
    runs the single-device module, more check their shards and hand them to `_distributed`."""

    def __init__(
        self,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        *,
        process_group=None,
        **attention_kwargs,
    ):
        super().__init__()
        from ..dilated import ImprovedDilatedAttention

        self.attention = ImprovedDilatedAttention(segment_lengths, dilation_rates, **attention_kwargs)
        self.process_group = process_group
        self.stats = CommStats()

    # which heads of the whole call this module's are (index, shards): a hybrid's ring holds head shard j of h
    head_shard: tuple[int, int] = (0, 1)

    def rank_world(self) -> tuple[int, int]:
        """(rank, ranks) of this module's sequence shards: its process group's (the hybrid overrides it)."""
        return group_rank_size(self.process_group)

    def head_range(self, heads: int) -> tuple[int, int] | None:
        """(first global head, total heads) of a call on `heads` local heads; None: they are all the heads."""
        index, shards = self.head_shard
        return None if shards == 1 else (index * heads, shards * heads)

    segment_lengths = property(lambda self: self.attention.segment_lengths)
    dilation_rates = property(lambda self: self.attention.dilation_rates)
    semantics = property(lambda self: self.attention.semantics)
    scale = property(lambda self: self.attention.scale)

    def signature(self) -> str:
        """The module's own state every rank must share (checked with each call's options, `check_call`)."""
        return f"{type(self).__name__}|{self.attention.signature()}|{self.head_shard}"

    def forward_with_lse(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        *,
        key_padding_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        need_lse: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse) of this rank's shard (batch, N/p, heads, head_dim) of the whole sequence; cu_seqlens:
        packed documents of the whole sequence, the same on every rank (distributed/documents.py); lse may be
        None when not need_lse."""
        rank, world = self.rank_world()
        if world == 1:
            heads = self.head_range(q.shape[2])
            return self.attention.forward_with_lse(
                q, k, v, is_causal, key_padding_mask=key_padding_mask, cu_seqlens=cu_seqlens, head_range=heads
            )
        check_qkv(q, k, v)
        check_key_padding_mask(key_padding_mask, q.shape[0], q.shape[1], q.device)
        return self._distributed(q, k, v, is_causal, key_padding_mask, cu_seqlens, need_lse, rank, world)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, **options):
        """q, k, v: this rank's shard (batch, N/p, heads, head_dim) -> its output shard (options:
        forward_with_lse's key_padding_mask and cu_seqlens)."""
        return self.forward_with_lse(q, k, v, is_causal, need_lse=False, **options)[0]

    def _distributed(self, q, k, v, is_causal, key_padding_mask, cu_seqlens, need_lse: bool, rank: int, world: int):
        """(out, lse) of a call over world > 1 ranks (lse may be None when not need_lse)."""
        raise NotImplementedError

    def comm_stats(self) -> dict[str, int]:
        return self.stats.snapshot()

    def reference(self, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """The dense reference on the whole sequence (see the single-device module's `reference`)."""
        return self.attention.reference(*args, **kwargs)
