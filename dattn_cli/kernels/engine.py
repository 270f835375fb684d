"""Block-wise dilated attention with an exact merge, behind one autograd boundary.

Forward: for every block of kept rows (pattern.Block), run the backend on (b, h, m, D) and merge its
(out, lse) into float32 accumulators with the shared merge routine. Backward: for every block, call the
backend's backward with the *merged* out and lse of its rows. Since the merged softmax is
P(t, u) = Σ_blocks exp(s(t, u) - lse(t)), each block's backward with the merged lse returns exactly
its share of the gradient, the merge weights included (nothing is detached); the shares add up.

Two ways to reach a block's rows (`RowAccess`):
* IndexAccess — gather rows by index into new tensors, scatter them back (DilatedAttention);
* ViewAccess  — strided views of the full tensors: no gather, merge and gradient adds in place
                (ImprovedDilatedAttention).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from . import combine
from .backends import BACKENDS, BlockCall, accumulator_dtype
from .heads import expand_kv, reduce_kv
from .merge import accumulate_, merge_partial_
from .pattern import Block
from .pool import MemoryPool


class RowAccess(Protocol):
    def gather(self, x: torch.Tensor, block: Block, takes_view: Callable[[torch.Tensor], bool] | None = None):
        """(B, N, H, ...) -> (B*S, m, H_block, ...), a view where possible (and where `takes_view` accepts it)."""

    def merge(self, out, lse, block: Block, block_out, block_lse) -> None:
        """Merge a block's (out (b, m, h, D), lse (b, m, h)) into the (B, N, H, ...) accumulators."""

    def add(self, acc: torch.Tensor, block: Block, value: torch.Tensor) -> None:
        """acc[rows of block] += value (b, m, h, D)."""

    def adopt(self, block: Block, value: torch.Tensor, shape: torch.Size) -> torch.Tensor | None:
        """`value` (b, m, h, ...) as the whole accumulator of `shape` (a view where possible), or None."""

    def release(self, *tensors: torch.Tensor) -> None:
        """Hand back scratch that `gather` took from the memory pool."""


class KeyBlockExecutor(Protocol):
    """Runs the key blocks beyond the engine's own `blocks`, into the same accumulators: the blocks whose keys
    live on other ranks (the sequence-parallel exchanges; block-sparse's ring form, block_sparse/ring.py), or
    every key block of a block table on one device (block_sparse/local.py).

    `forward` merges their partial results into the fp32 accumulators (out, lse) of the engine's blocks;
    `backward` adds their gradient shares into the accumulators (dq, dk, dv), the shares of this rank's
    keys computed elsewhere included. Both see the merged out and lse, as every engine block does.
    """

    def forward(self, attention: BlockAttention, q, k, v, key_pad, out, lse) -> None: ...

    def backward(self, attention: BlockAttention, dout, q, k, v, out, lse, key_pad, grads: list) -> None: ...


class AttentionCall(Protocol):
    """What the autograd boundary calls: BlockAttention, chunks.ChunkedAttention and window.BandAttention."""

    def forward(self, q, k, v, key_pad=None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward(self, dout, q, k, v, out, lse, key_pad=None) -> tuple[torch.Tensor, ...]: ...


def _batch_segments(x: torch.Tensor, block: Block) -> torch.Tensor:
    """(b, ...) with b = B * S back to (B, S, ...)."""
    return x.unflatten(0, (-1, block.num_segments))


class ViewAccess:
    """Rows as strided views: merge and gradient sums in place, no scatter.

    r = 1 blocks are passed as views. The widely strided views of a dilated pair (r > 1) are passed as views
    where the block's kernel takes them (`takes_view`: the backend's, from block_kernels.takes_view), else
    copied into (b, h, m, D) scratch buffers from the memory pool and released after the call.
    """

    def __init__(self, pool: MemoryPool | None = None):
        self.pool = pool
        self._lent: dict[int, torch.Tensor] = {}

    def gather(self, x, block, takes_view=None):
        # a view unless B > 1 and a ragged tail splits (B, S)
        view = (block.view(x) if torch.is_grad_enabled() and x.requires_grad else block.strided(x)).flatten(0, 1)
        if block.rate == 1 or view.dim() != 4 or (takes_view is not None and takes_view(view)):
            return view
        b, m, h, d = view.shape
        if self.pool is None:
            return view.transpose(1, 2).contiguous().transpose(1, 2)
        buf = self.pool.acquire((b, h, m, d), x.dtype, x.device)
        buf.copy_(view.transpose(1, 2))
        self._lent[id(buf)] = buf
        return buf.transpose(1, 2)

    def release(self, *tensors):
        for t in tensors:
            base = t._base if t._base is not None else t
            if self._lent.pop(id(base), None) is not None:
                self.pool.release(base)

    def merge(self, out, lse, block, block_out, block_lse):
        merge_partial_(
            block.view(out), block.view(lse), _batch_segments(block_out, block), _batch_segments(block_lse, block)
        )

    def add(self, acc, block, value):
        accumulate_(block.view(acc), _batch_segments(value, block))

    def adopt(self, block, value, shape):
        # A block holding every row of every head (a pair with r = 1, N divisible by w) can hand its
        # result over as the accumulator: the fused kernels lay (b, h, m, D) out as (b, m, h, D).
        covers = (
            block.start == 0
            and block.num_segments * block.seg_len == shape[1]
            and block.rate == 1
            and block.head_start == 0
            and block.head_step == 1
            and block.num_heads == shape[2]
        )
        return value.reshape(shape) if covers else None  # a view where the layout allows (out is), else a copy


class IndexAccess:
    """Rows gathered and scattered through flat (N * H) index tensors."""

    def __init__(self, index: dict[Block, torch.Tensor]):
        self._index = index

    def _idx(self, block):
        return self._index[block]

    def _flat(self, x):
        return x.flatten(1, 2)

    def gather(self, x, block, takes_view=None):
        rows = self._flat(x).index_select(1, self._idx(block))
        return rows.view(x.shape[0] * block.num_segments, block.rows, block.num_heads, *x.shape[3:])

    def merge(self, out, lse, block, block_out, block_lse):
        idx = self._idx(block)
        out_rows = self._flat(out).index_select(1, idx)
        lse_rows = self._flat(lse).index_select(1, idx)
        merge_partial_(out_rows, lse_rows, block_out.reshape(out_rows.shape), block_lse.reshape(lse_rows.shape))
        self._flat(out).index_copy_(1, idx, out_rows)
        self._flat(lse).index_copy_(1, idx, lse_rows)

    def add(self, acc, block, value):
        self._flat(acc).index_add_(1, self._idx(block), value.reshape(acc.shape[0], -1, *acc.shape[3:]).to(acc.dtype))

    def adopt(self, block, value, shape):
        return None

    def release(self, *tensors):
        pass


# Dropout streams: (rank, set, member) as one mixed-radix number in the 32 bits a CPU generator is seeded with
STREAM_FIELDS = (("rank", 10), ("set", 11), ("member", 11))


def dropout_stream(seed: int, rank: int, set: int, member: int) -> int:
    """The generator seed of one block call's dropout masks, the one rule for every module:
    seed: the call's random seed (prepare_call); rank: the rank computing; set: which queries (the engine's
    block number, a spanning pair's head set, a block-sparse query block of the shard); member: whose keys (0:
    the rank's own; dilated ring 1 + j: group member j's; block-sparse 1: own keys on the causal diagonal,
    2 + s: received from rank s).

    (rank, set, member) is a mixed-radix number below 2**32 (STREAM_FIELDS) added to seed mod 2**64: distinct
    triples give distinct seeds, in the low 32 bits too (all that torch's CPU generator uses), for rank < 1024,
    set < 2048 and member < 2048. Larger values wrap around their field (streams may then repeat)."""
    key = 0
    for (_, bits), value in zip(STREAM_FIELDS, (rank, set, member)):
        key = (key << bits) | (value % (1 << bits))
    return (seed + key) % (1 << 64)


@dataclass
class BlockAttention:
    """Everything one call needs: blocks, how to reach their rows, the backend and its options."""

    blocks: Sequence[Block]
    access: RowAccess
    backend: str
    call: BlockCall
    pool: MemoryPool | None = None
    key_blocks: KeyBlockExecutor | None = None
    rank: int = 0  # the rank computing: its dropout streams differ from other ranks' (dropout_stream)

    def _key_pad(self, key_pad: torch.Tensor | None, block: Block) -> torch.Tensor | None:
        if key_pad is None:
            return None
        end = block.start + block.num_segments * block.seg_len
        rows = key_pad[:, block.start : end].unflatten(1, (block.num_segments, block.seg_len))
        return rows[:, :, block.offset :: block.rate].flatten(0, 1)

    def _call(self, set: int, member: int = 0, causal: bool | None = None) -> BlockCall:
        """The backend options of one block call; its dropout stream from (rank, set, member)."""
        c = self.call
        seed = dropout_stream(c.seed, self.rank, set, member) if c.dropout_p > 0 else c.seed
        return BlockCall(c.causal if causal is None else causal, c.scale, c.dropout_p, seed)

    def _accumulator(self, like: torch.Tensor, shape, fill: float | None) -> tuple[torch.Tensor, bool]:
        """fp32 (or fp64) accumulator, filled unless fill is None; from the pool when it is scratch (half inputs)."""
        dtype = accumulator_dtype(like.dtype)
        scratch = dtype != like.dtype and self.pool is not None
        acc = (
            self.pool.acquire(shape, dtype, like.device)
            if scratch
            else torch.empty(shape, dtype=dtype, device=like.device)
        )
        return (acc if fill is None else acc.fill_(fill)), scratch

    def _adopt(self, block, value, shape, like) -> tuple[torch.Tensor, bool] | None:
        """The first block's own result as the accumulator, when it covers everything: itself in the
        accumulator's dtype, else cast into a new accumulator in one pass (not a fill and a merge or add)."""
        whole = self.access.adopt(block, value, shape)
        if whole is None:
            return None
        if whole.dtype == accumulator_dtype(like.dtype):
            return whole, False
        acc, scratch = self._accumulator(like, shape, None)
        return acc.copy_(whole), scratch

    def _finish(self, acc: torch.Tensor, scratch: bool, dtype: torch.dtype) -> torch.Tensor:
        result = acc.to(dtype)
        if scratch:
            self.pool.release(acc)
        return result

    def _combines(self, x: torch.Tensor) -> bool:
        """Whether this call keeps every block's result and combines them in one pass (combine.py)."""
        return self.key_blocks is None and isinstance(self.access, ViewAccess) and combine.applies(x, len(self.blocks))

    def _backend(self, key_pad):
        """The call's backend and its rule for which gathers may stay views (backends.py)."""
        backend = BACKENDS[self.backend]
        return backend, functools.partial(backend.takes_view, masked=key_pad is not None)

    def _gathered(self, block: Block, tensors, takes):
        return [self.access.gather(x, block, takes).transpose(1, 2) for x in tensors]

    def _forward_combined(self, q, k, v, key_pad, into):
        backend, takes = self._backend(key_pad)
        outs, lses = [], []
        for i, block in enumerate(self.blocks):
            qb, kb, vb = self._gathered(block, (q, k, v), takes)
            block_out, block_lse = backend.forward(qb, kb, vb, self._key_pad(key_pad, block), self._call(i))
            self.access.release(qb, kb, vb)
            outs.append(block_out.transpose(1, 2))
            lses.append(block_lse.transpose(1, 2))
        out, lse = into or (torch.empty_like(q), q.new_empty(q.shape[:3], dtype=accumulator_dtype(q.dtype)))
        combine.merge_into(out, lse, self.blocks, outs, lses)
        return out, lse

    def _backward_combined(self, dout, q, k, v, out, lse, key_pad, into):
        backend, takes = self._backend(key_pad)
        shares: tuple[list, list, list] = ([], [], [])
        parts = ()
        for i, block in enumerate(self.blocks):
            qb, kb, vb, dob, ob = self._gathered(block, (q, k, v, dout, out), takes)
            lb = self.access.gather(lse, block).transpose(1, 2)
            parts = backend.backward(dob, qb, kb, vb, ob, lb, self._key_pad(key_pad, block), self._call(i))
            self.access.release(qb, kb, vb, dob, ob)
            for share, part in zip(shares, parts):
                share.append(part.transpose(1, 2))
        del parts
        grads = []
        for j, x in enumerate((q, k, v)):  # each gradient made, summed into, and its shares freed in turn
            grads.append(into[j] if into else torch.empty_like(x))
            combine.sum_into(grads[j], self.blocks, shares[j])
            shares[j].clear()
        return tuple(grads)

    def forward(self, q, k, v, key_pad=None, into=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse), written into `into` (out, lse) when given (a chunk's slices of the whole call's)."""
        if self._combines(q):
            combine.note_path("one-pass")
            return self._forward_combined(q, k, v, key_pad, into)
        combine.note_path("accumulating")
        out, lse = self._forward_accumulated(q, k, v, key_pad)
        if into is None:
            return out, lse
        into[0].copy_(out)
        into[1].copy_(lse)
        return into

    def _forward_accumulated(self, q, k, v, key_pad) -> tuple[torch.Tensor, torch.Tensor]:
        backend, takes = self._backend(key_pad)
        out = lse = None
        scratch = False
        for i, block in enumerate(self.blocks):
            qb, kb, vb = self._gathered(block, (q, k, v), takes)
            block_out, block_lse = backend.forward(qb, kb, vb, self._key_pad(key_pad, block), self._call(i))
            self.access.release(qb, kb, vb)
            block_out, block_lse = block_out.transpose(1, 2), block_lse.transpose(1, 2)
            if out is None:
                lse_acc = self._adopt(block, block_lse, q.shape[:3], q)
                out_acc = lse_acc and self._adopt(block, block_out, q.shape, q)
                if out_acc:
                    (out, scratch), (lse, _) = out_acc, lse_acc
                    continue
                out, scratch = self._accumulator(q, q.shape, 0.0)
                lse, _ = self._accumulator(out, q.shape[:3], float("-inf"))
            self.access.merge(out, lse, block, block_out, block_lse)
        if out is None:  # no local block at all
            out, scratch = self._accumulator(q, q.shape, 0.0)
            lse, _ = self._accumulator(out, q.shape[:3], float("-inf"))
        if self.key_blocks is not None:
            self.key_blocks.forward(self, q, k, v, key_pad, out, lse)
        return self._finish(out, scratch, q.dtype), lse

    def backward(self, dout, q, k, v, out, lse, key_pad=None, into=None):
        """(dq, dk, dv), written into `into` when given (a chunk's slices of the whole call's)."""
        dout = dout.to(q.dtype)
        if self._combines(q):
            combine.note_path("one-pass")
            return self._backward_combined(dout, q, k, v, out, lse, key_pad, into)
        combine.note_path("accumulating")
        grads = self._backward_accumulated(dout, q, k, v, out, lse, key_pad)
        if into is None:
            return grads
        for dest, grad in zip(into, grads):
            dest.copy_(grad)
        return tuple(into)

    def _backward_accumulated(self, dout, q, k, v, out, lse, key_pad):
        backend, takes = self._backend(key_pad)
        grads: list[tuple[torch.Tensor, bool] | None] = [None, None, None]
        for i, block in enumerate(self.blocks):
            qb, kb, vb, dob, ob = self._gathered(block, (q, k, v, dout, out), takes)
            lb = self.access.gather(lse, block).transpose(1, 2)
            parts = backend.backward(dob, qb, kb, vb, ob, lb, self._key_pad(key_pad, block), self._call(i))
            self.access.release(qb, kb, vb, dob, ob)
            for j, (x, part) in enumerate(zip((q, k, v), parts)):
                part = part.transpose(1, 2)
                if grads[j] is None:
                    grads[j] = self._adopt(block, part, x.shape, x)
                    if grads[j] is not None:
                        continue
                    grads[j] = self._accumulator(x, x.shape, 0.0)
                self.access.add(grads[j][0], block, part)
        for j, x in enumerate((q, k, v)):
            if grads[j] is None:
                grads[j] = self._accumulator(x, x.shape, 0.0)
        if self.key_blocks is not None:
            self.key_blocks.backward(self, dout, q, k, v, out, lse, key_pad, [acc for acc, _ in grads])
        return tuple(self._finish(acc, scratch, x.dtype) for (acc, scratch), x in zip(grads, (q, k, v)))


class DilatedAttentionFunction(torch.autograd.Function):
    """The autograd boundary: (q, k, v) -> (out, lse); lse is returned but not differentiable. k, v may have fewer
    heads (GQA): repeated to q's heads for the call and again in backward, saved at their own heads (heads.py)."""

    @staticmethod
    def forward(ctx, q, k, v, key_pad, attention: AttentionCall):
        out, lse = attention.forward(q, *expand_kv(k, v, q.shape[2]), key_pad)
        ctx.save_for_backward(q, k, v, out, lse, key_pad)
        ctx.attention = attention
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, key_pad = ctx.saved_tensors
        dq, dk, dv = ctx.attention.backward(dout, q, *expand_kv(k, v, q.shape[2]), out, lse, key_pad)
        return dq, reduce_kv(dk, k.shape[2]), reduce_kv(dv, v.shape[2]), None, None


def block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_pad: torch.Tensor | None,
    attention: AttentionCall,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of `attention` on q, k, v (k, v at H or fewer kv heads), through the autograd boundary when a
    gradient is wanted."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return DilatedAttentionFunction.apply(q, k, v, key_pad, attention)
    return attention.forward(q, *expand_kv(k, v, q.shape[2]), key_pad)
