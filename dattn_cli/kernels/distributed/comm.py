"""What every distributed implementation shares: its group, byte accounting, up-front consistency checks."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn


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
        self.counts = {
            "forward_bytes_sent": 0,
            "forward_bytes_received": 0,
            "backward_bytes_sent": 0,
            "backward_bytes_received": 0,
            "forward_calls": 0,
        }

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


def post_exchange(
    sends: dict[int, torch.Tensor], receives: dict[int, torch.Tensor], group, stats: CommStats, tag: int, phase: str
) -> list:
    """Post point-to-point sends to and receives from ranks of `group` (batch_isend_irecv), their bytes counted
    in `stats`; the works to wait on."""
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    ops = [dist.P2POp(dist.isend, buf, peer(r), group, tag) for r, buf in sends.items()]
    ops += [dist.P2POp(dist.irecv, buf, peer(r), group, tag) for r, buf in receives.items()]
    size = lambda bufs: sum(b.numel() * b.element_size() for b in bufs.values())  # noqa: E731
    stats.add(phase, size(sends), size(receives))
    return dist.batch_isend_irecv(ops) if ops else []


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


class DistributedAttention(nn.Module):
    """What every distributed module holds: the single-device attention it delegates to (world size 1,
    or the per-rank work), its process group and its byte counts."""

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

    segment_lengths = property(lambda self: self.attention.segment_lengths)
    dilation_rates = property(lambda self: self.attention.dilation_rates)
    semantics = property(lambda self: self.attention.semantics)
    scale = property(lambda self: self.attention.scale)

    def comm_stats(self) -> dict[str, int]:
        return self.stats.snapshot()

    def reference(self, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """The dense reference on the whole sequence (see the single-device module's `reference`)."""
        return self.attention.reference(*args, **kwargs)
