"""Grouped key/value heads (GQA; MQA with one kv head): q (B, N, H, D), k and v (B, N, H_kv, D) with
H % H_kv == 0, query head h attending with kv head h // (H / H_kv) (flash-attn's convention).

Every implementation computes on K/V repeated to H heads (`expand_kv`), as transformers' `repeat_kv` does, but
inside its autograd boundary (engine.DilatedAttentionFunction, which the sliding window uses too): the repeated copies
exist only while a call runs (made again in backward), the kv-head K/V are what is saved between forward and
backward, and the gradients of each group are summed into its kv head there (`reduce_kv`).
What moves between ranks stays at the kv heads: an exchange packs one representative query head per kv
head of a head set (`KVHeadSet`), the receiver repeats it back, and the dK/dV shares go home summed
over each group and land on the representative head (the group's sum is what autograd forms anyway).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from .backends import accumulator_dtype


def kv_group(num_heads: int, num_kv_heads: int) -> int:
    """Query heads per kv head; a ValueError naming the fix when H is not a multiple of H_kv."""
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(
            f"k and v have {num_kv_heads} heads but q has {num_heads}: the query heads must be a multiple of the "
            f"key/value heads (GQA/MQA), e.g. kv heads in {divisors(num_heads)}"
        )
    return num_heads // num_kv_heads


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def expand_kv(k: torch.Tensor, v: torch.Tensor, num_heads: int, dim: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v (B, N, H_kv, D) repeated to (B, N, H, D) (heads along `dim`), kv head j serving query heads
    j*g .. j*g + g - 1; returned as they are when H_kv = H."""
    group = kv_group(num_heads, k.shape[dim])
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=dim), v.repeat_interleave(group, dim=dim)


def heads_first(x: torch.Tensor) -> torch.Tensor:
    """(B, N, H, ...) -> contiguous (B, H, N, ...): every block call then reads contiguous rows per head,
    which the CPU kernel runs up to 1.4x faster than strided views (measured at N=32K, 25% density)."""
    return x.transpose(1, 2).contiguous()


def reduce_kv(grad: torch.Tensor, kv_heads: int, dim: int = 2) -> torch.Tensor:
    """The gradient of repeated K or V (heads along `dim`) summed over each kv head's group, in fp32 (fp64 for
    fp64) and returned in grad's dtype: half gradients are rounded once, after the sum."""
    if grad.shape[dim] == kv_heads:
        return grad
    return grad.to(accumulator_dtype(grad.dtype)).unflatten(dim, (kv_heads, -1)).sum(dim + 1).to(grad.dtype)


@dataclass(frozen=True)
class KVHeadSet:
    """The kv heads behind a set of query heads `first, first + step, ...` (`count` of them), g per kv head.

    `keep`: positions in the set of one query head per distinct kv head (what is packed); `spread`: for
    every position in the set, its kv head's index among the kept (what the receiver repeats by)."""

    first: int
    step: int
    count: int
    group: int = 1

    @cached_property
    def _kv(self) -> list[int]:
        return [(self.first + i * self.step) // self.group for i in range(self.count)]

    @cached_property
    def keep(self) -> list[int]:
        seen: dict[int, int] = {}
        for i, j in enumerate(self._kv):
            seen.setdefault(j, i)
        return list(seen.values())

    @cached_property
    def spread(self) -> list[int]:
        order = {j: n for n, j in enumerate(dict.fromkeys(self._kv))}
        return [order[j] for j in self._kv]

    @cached_property
    def kv_count(self) -> int:
        return len(set(self._kv))

    def pack(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """x with `count` heads along dim -> its kv_count kept heads."""
        if self.kv_count == self.count:
            return x
        return x.index_select(dim, torch.tensor(self.keep, device=x.device))

    def unpack(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """x with kv_count heads along dim -> `count` heads, each its kv head's copy."""
        if self.kv_count == self.count:
            return x
        return x.index_select(dim, torch.tensor(self.spread, device=x.device))

    def reduce(self, grad: torch.Tensor, dim: int) -> torch.Tensor:
        """A gradient with `count` heads along dim -> kv_count heads, summed over each kv head's group."""
        if self.kv_count == self.count:
            return grad
        shape = list(grad.shape)
        shape[dim] = self.kv_count
        return grad.new_zeros(shape).index_add_(dim, torch.tensor(self.spread, device=grad.device), grad)

    def place(self, grad: torch.Tensor, dim: int) -> torch.Tensor:
        """A kv-head gradient (kv_count heads) as `count` heads: on each kept head, zero on the others.
        Added to the gradient of the repeated K/V it gives the same group sums."""
        if self.kv_count == self.count:
            return grad
        shape = list(grad.shape)
        shape[dim] = self.count
        return grad.new_zeros(shape).index_copy_(dim, torch.tensor(self.keep, device=grad.device), grad)
