"""Block-sparse attention over a block table (block_patterns.py), single-device or as a ring.

Semantics: each query attends, in one softmax, every key of the key blocks its query block's row of
the table marks (causal: none after it). Rows with no key output 0 with lse -inf.

Two executors, chosen per call and reported by `describe()`:

* flex   — `torch.nn.attention.flex_attention` with a `BlockMask` built from the table (compiled):
           CUDA forward and backward; CPU forward only (torch compiles flex on CPU for inference,
           without the logsumexp).
* gather — for each query block, its active key blocks as one call: a slice when they are contiguous,
           an index gather otherwise; the causal diagonal block as a second call. Partial results
           merge with the shared merge routine through the engine's autograd boundary (engine.py),
           whose backward hands every call the merged out and lse.

Ring form (a process group of p ranks): rank a holds the contiguous query and key blocks
[a·L/b, (a+1)·L/b) (L = N/p, b = block_size, L % b == 0). Every rank knows the table, so each knows
which of its key blocks every other rank's queries use: it sends exactly those (K, V and the key mask
rows) and receives exactly the blocks its own queries use — no transfer for a block no local query
attends. Transfers are posted before the local blocks are computed. Backward sends each received
block's dK/dV share home.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from ..backends import BACKENDS
from .patterns import USES_SEGMENTS, BlockPattern, attended_pairs
from ..distributed.comm import CommStats, check_consistent, group_rank_size
from ..dilated import AttentionCore
from ..engine import BlockAttention, ViewAccess, block_attention
from ..merge import merge_partial_
from ..reference import block_sparse_reference
from ..validation import check_key_padding_mask, check_qkv

TAG_KV, TAG_HOME = 21, 22
EXECUTORS = ("auto", "flex", "gather")
KeyRows = slice | torch.Tensor  # rows of a key source: a contiguous range, or gathered by index


@dataclass(frozen=True)
class Part:
    """One backend call: local query rows against key rows of one source."""

    queries: slice
    keys: KeyRows
    causal: bool
    seed: int


@dataclass(frozen=True)
class RankPlan:
    """What one rank computes and exchanges for one (shape, pattern, causal) call."""

    local: tuple[Part, ...]  # against this rank's own key blocks
    remote: dict[int, tuple[Part, ...]]  # source rank -> parts against the blocks received from it
    receive: dict[int, tuple[int, ...]]  # source rank -> its global key blocks this rank's queries use
    send: dict[int, torch.Tensor]  # destination rank -> local rows of this rank's blocks it uses


def _rows(x: torch.Tensor, keys: KeyRows, dim: int = 2) -> torch.Tensor:
    """Rows `keys` along `dim` (2 for (B, H, rows, D) tensors, 1 for (B, rows) key masks)."""
    if isinstance(keys, slice):
        return x.narrow(dim, keys.start, keys.stop - keys.start)
    return x.index_select(dim, keys)


def _add_rows(acc: torch.Tensor, keys: KeyRows, value: torch.Tensor) -> None:
    if isinstance(keys, slice):
        _rows(acc, keys).add_(value)
    else:
        acc.index_add_(2, keys, value.to(acc.dtype))


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """(B, N, H, ...) -> contiguous (B, H, N, ...): every block call then reads contiguous rows per head,
    which the CPU kernel runs up to 1.4x faster than strided views (measured at N=32K, 25% density)."""
    return x.transpose(1, 2).contiguous()


def _block_rows(position: int, block_size: int, total_rows: int) -> tuple[int, int]:
    return position * block_size, min((position + 1) * block_size, total_rows)


def plan_parts(
    table: torch.Tensor, query_blocks: Sequence[int], query_rows: int, source_blocks: Sequence[int],
    source_rows: int, block_size: int, causal: bool, device: torch.device, source_id: int = 0,
) -> tuple[Part, ...]:
    """The calls of `query_blocks` (global ids, local rows from 0) against a source holding the global key
    blocks `source_blocks` in order (rows position·block_size ...)."""
    source = torch.tensor(list(source_blocks), dtype=torch.long)
    where = {g: i for i, g in enumerate(source_blocks)}
    parts = []
    for qi, g in enumerate(query_blocks):
        queries = slice(*_block_rows(qi, block_size, query_rows))
        active = table[g, source].clone()
        if causal:
            active &= source <= g
        seed = (g * 64 + source_id) * 2
        if causal and g in where and active[where[g]]:
            active[where[g]] = False
            parts.append(Part(queries, slice(*_block_rows(where[g], block_size, source_rows)), True, seed + 1))
        positions = active.nonzero().flatten().tolist()
        if not positions:
            continue
        if positions[-1] - positions[0] + 1 == len(positions):  # contiguous: a slice, no copy
            keys: KeyRows = slice(_block_rows(positions[0], block_size, source_rows)[0],
                                  _block_rows(positions[-1], block_size, source_rows)[1])
        else:
            keys = torch.cat([torch.arange(*_block_rows(p, block_size, source_rows)) for p in positions]).to(device)
        parts.append(Part(queries, keys, False, seed))
    return tuple(parts)


def plan_rank(
    table: torch.Tensor, seq_len: int, block_size: int, rank: int, world: int, causal: bool, device: torch.device
) -> RankPlan:
    num_blocks = table.shape[0]
    shard = seq_len // world
    per_rank = -(-shard // block_size)
    owned = [list(range(r * per_rank, min((r + 1) * per_rank, num_blocks))) for r in range(world)]
    allowed = table.tril() if causal else table

    def used(by: int, of: int) -> tuple[int, ...]:
        rows = allowed[owned[by]][:, owned[of]]
        return tuple(owned[of][j] for j in rows.any(dim=0).nonzero().flatten().tolist())

    mine = owned[rank]
    local = plan_parts(table, mine, shard, mine, shard, block_size, causal, device)
    receive, remote, send = {}, {}, {}
    for other in range(world):
        if other == rank:
            continue
        if blocks := used(rank, other):
            receive[other] = blocks
            rows = len(blocks) * block_size
            remote[other] = plan_parts(table, mine, shard, blocks, rows, block_size, causal, device, source_id=1 + other)
        if blocks := used(other, rank):
            first = mine[0]
            send[other] = torch.cat([torch.arange(*_block_rows(g - first, block_size, shard)) for g in blocks]).to(device)
    return RankPlan(tuple(local), remote, receive, send)


def attend_parts(attention: BlockAttention, parts, q, k, v, key_pad, out, lse) -> None:
    """q, k, v (B, H, rows, D); merge every part's (out, lse) into the fp32 accumulators out (B, N, H, D)
    and lse (B, N, H)."""
    backend = BACKENDS[attention.backend]
    for part in parts:
        qb = q[:, :, part.queries]
        kb, vb = _rows(k, part.keys), _rows(v, part.keys)
        pad = None if key_pad is None else _rows(key_pad, part.keys, 1)
        block_out, block_lse = backend.forward(qb, kb, vb, pad, attention._call(part.seed, part.causal))
        merge_partial_(out[:, part.queries], lse[:, part.queries], block_out.transpose(1, 2), block_lse.transpose(1, 2))


def attend_parts_backward(attention: BlockAttention, parts, dout, q, out, lse, k, v, key_pad, dq, dk, dv) -> None:
    """Each part's gradient share with the merged out and lse, added into dq and the source's dk, dv; every
    tensor (B, H, rows, D), lse (B, H, rows)."""
    backend = BACKENDS[attention.backend]
    for part in parts:
        qb, dob, ob, lb = (x[:, :, part.queries] for x in (q, dout, out, lse))
        kb, vb = _rows(k, part.keys), _rows(v, part.keys)
        pad = None if key_pad is None else _rows(key_pad, part.keys, 1)
        dq_part, dk_part, dv_part = backend.backward(dob, qb, kb, vb, ob, lb, pad, attention._call(part.seed, part.causal))
        dq[:, :, part.queries].add_(dq_part)
        _add_rows(dk, part.keys, dk_part)
        _add_rows(dv, part.keys, dv_part)


class BlockSparseExchange:
    """RemoteBlocks of the block-sparse module (engine.py): the rank's own key blocks, then the key blocks
    received from other ranks (ring form). Kept from forward to backward: the received blocks."""

    def __init__(self, plan: RankPlan, block_size: int, group, stats: CommStats):
        self.plan, self.block_size, self.group, self.stats = plan, block_size, group, stats
        self.received: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}

    def _peer(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def _post(self, sends: dict[int, torch.Tensor], receives: dict[int, torch.Tensor], tag: int, phase: str):
        ops = [dist.P2POp(dist.isend, buf, self._peer(r), self.group, tag) for r, buf in sends.items()]
        ops += [dist.P2POp(dist.irecv, buf, self._peer(r), self.group, tag) for r, buf in receives.items()]
        size = lambda bufs: sum(b.numel() * b.element_size() for b in bufs.values())  # noqa: E731
        self.stats.add(phase, size(sends), size(receives))
        return dist.batch_isend_irecv(ops) if ops else []

    @staticmethod
    def _pack(rows: torch.Tensor, k, v, key_pad) -> torch.Tensor:
        """K and V rows (heads first, as the receiver attends them) and the key-mask rows, in one buffer."""
        parts = [k.index_select(2, rows).reshape(-1), v.index_select(2, rows).reshape(-1)]
        if key_pad is not None:
            parts.append(key_pad.index_select(1, rows).to(k.dtype).reshape(-1))
        return torch.cat(parts)

    def forward(self, attention: BlockAttention, q, k, v, key_pad, out, lse) -> None:
        batch, _, heads, head_dim = k.shape
        q, k, v = (_heads_first(x) for x in (q, k, v))
        buffers = {}
        for src, blocks in self.plan.receive.items():
            rows = len(blocks) * self.block_size
            buffers[src] = k.new_empty(batch * rows * (2 * heads * head_dim + (key_pad is not None)))
        sends = {dst: self._pack(rows, k, v, key_pad) for dst, rows in self.plan.send.items()}
        works = self._post(sends, buffers, TAG_KV, "forward")
        attend_parts(attention, self.plan.local, q, k, v, key_pad, out, lse)  # while the blocks travel
        for work in works:
            work.wait()
        for src, buf in buffers.items():
            rows = len(self.plan.receive[src]) * self.block_size
            size = batch * rows * heads * head_dim
            kr = buf[:size].view(batch, heads, rows, head_dim)
            vr = buf[size : 2 * size].view(batch, heads, rows, head_dim)
            pad = buf[2 * size :].view(batch, rows).bool() if key_pad is not None else None
            self.received[src] = (kr, vr, pad)
            attend_parts(attention, self.plan.remote[src], q, kr, vr, pad, out, lse)

    def backward(self, attention: BlockAttention, dout, q, k, v, out, lse, key_pad, grads) -> None:
        batch, _, heads, head_dim = k.shape
        dout, q, k, v, out, lse = (_heads_first(x) for x in (dout, q, k, v, out, lse))
        acc = grads[0].dtype
        dq, dk, dv = (g.transpose(1, 2) for g in grads)  # the engine's (B, N, H, D) accumulators, heads first
        shares = {}
        for src, (kr, vr, pad) in self.received.items():  # remote shares first, so they travel during local work
            dkr, dvr = torch.zeros(kr.shape, dtype=acc, device=kr.device), torch.zeros(vr.shape, dtype=acc, device=vr.device)
            attend_parts_backward(attention, self.plan.remote[src], dout, q, out, lse, kr, vr, pad, dq, dkr, dvr)
            shares[src] = torch.cat([dkr.reshape(-1), dvr.reshape(-1)])
        home = {dst: dk.new_empty(2 * batch * heads * rows.numel() * head_dim) for dst, rows in self.plan.send.items()}
        works = self._post(shares, home, TAG_HOME, "backward")
        attend_parts_backward(attention, self.plan.local, dout, q, out, lse, k, v, key_pad, dq, dk, dv)
        for work in works:
            work.wait()
        for dst, buf in home.items():
            rows = self.plan.send[dst]
            size = batch * heads * rows.numel() * head_dim
            dk.index_add_(2, rows, buf[:size].view(batch, heads, -1, head_dim))
            dv.index_add_(2, rows, buf[size:].view(batch, heads, -1, head_dim))
        self.received.clear()


# FlexAttention ---------------------------------------------------------------------------------------


def flex_block_mask(table: torch.Tensor, seq_len: int, block_size: int, causal: bool, device: torch.device):
    """The table as a FlexAttention BlockMask: whole blocks as "full" blocks (no mask_mod evaluated),
    the causal diagonal and the ragged last row/column as partial blocks checked by mask_mod."""
    from torch.nn.attention.flex_attention import BlockMask

    num_blocks = table.shape[0]
    allowed = table.tril() if causal else table
    partial = torch.zeros_like(allowed)
    if causal:
        partial |= torch.eye(num_blocks, dtype=torch.bool)
    if seq_len % block_size:
        partial[-1, :] = True
        partial[:, -1] = True
    partial &= allowed
    full = allowed & ~partial

    def counts_and_indices(blocks: torch.Tensor):
        counts = blocks.sum(-1).to(torch.int32)
        order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[None, None].to(device), order[None, None].to(device)

    table_on_device = allowed.to(device)
    last = seq_len - 1

    def mask_mod(b, h, q_idx, kv_idx):
        ok = table_on_device[q_idx.clamp(max=last) // block_size, kv_idx.clamp(max=last) // block_size]
        ok = ok & (kv_idx <= last) & (q_idx <= last)
        return ok & (kv_idx <= q_idx) if causal else ok

    kv_num, kv_idx = counts_and_indices(partial)
    full_num, full_idx = counts_and_indices(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod,
                                    seq_lengths=(seq_len, seq_len))


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_forward(q, k, v, block_mask, scale: float, *, need_lse: bool, compiled: bool = True):
    """q, k, v (B, N, H, D) -> (out (B, N, H, D), lse (B, N, H) or None); eager when not compiled (the
    dense math of flex: for checks on small shapes)."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    fn = _compiled_flex() if compiled else flex_attention
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with warnings.catch_warnings():
        if not compiled:  # eager on purpose: silence torch's "use torch.compile" advice
            warnings.simplefilter("ignore", UserWarning)
        if need_lse:
            out, aux = fn(qt, kt, vt, block_mask=block_mask, scale=scale, return_aux=AuxRequest(lse=True))
            return out.transpose(1, 2), aux.lse.transpose(1, 2)
        return fn(qt, kt, vt, block_mask=block_mask, scale=scale).transpose(1, 2), None


def flex_compiles_on(device: torch.device) -> bool:
    """Whether torch can compile flex attention for this device here (triton for CUDA, a C++ compiler
    for CPU); looked up once per device type, not on every call."""
    return _flex_compiles_on(device.type)


@functools.lru_cache(maxsize=None)
def _flex_compiles_on(device_type: str) -> bool:
    import importlib.util
    import shutil

    if device_type == "cuda":
        return importlib.util.find_spec("triton") is not None
    return device_type == "cpu" and any(shutil.which(c) for c in ("g++", "c++", "clang++"))


# the module ------------------------------------------------------------------------------------------


class BlockSparseRingDilatedAttention(AttentionCore):
    """Block-sparse attention with a named pattern; with a process group, the ring form (each rank passes
    its contiguous shard (B, N/p, H, D)).

    pattern: local | dilated | global_local | hierarchical | longnet (block_patterns.py); window (blocks
    each side), global_blocks, levels, or density (a target block density that picks the window).
    executor: auto | flex | gather (see the module docstring; `describe()` says which ran and why).
    """

    default_pattern_cache = True
    default_memory_pool = False

    def __init__(
        self,
        segment_lengths: Sequence[int] | None = None,
        dilation_rates: Sequence[int] | None = None,
        *,
        pattern: str = "dilated",
        block_size: int = 128,
        window: int | None = None,
        global_blocks: int = 1,
        levels: int = 2,
        density: float | None = None,
        semantics: str = "longnet",
        executor: str = "auto",
        process_group=None,
        scale: float | None = None,
        dropout: float = 0.0,
        backend: str = "auto",
        use_pattern_cache: bool | None = None,
        enable_memory_pool: bool | None = None,
    ):
        super().__init__(scale=scale, dropout=dropout, backend=backend, use_pattern_cache=use_pattern_cache,
                         enable_memory_pool=enable_memory_pool)
        if pattern in USES_SEGMENTS and (segment_lengths is None or dilation_rates is None):
            raise ValueError(f"pattern={pattern!r} needs segment_lengths and dilation_rates, e.g. [2048, 4096] and [1, 2]")
        if semantics != "longnet" and pattern != "longnet":
            raise ValueError(f"semantics={semantics!r} only applies to pattern='longnet'; leave it at 'longnet'")
        self.pattern = BlockPattern(
            pattern, block_size, window, global_blocks, levels, density,
            tuple(segment_lengths or ()), tuple(dilation_rates or ()), semantics,
        )
        if executor not in EXECUTORS:
            raise ValueError(f"executor={executor!r} is unknown: use one of {', '.join(EXECUTORS)}")
        self.executor = executor
        self.process_group = process_group
        self.stats = CommStats()
        self.last_executor: tuple[str, str] | None = None
        self.last_shape: tuple[int, int] | None = None  # (N, H) of the last call, for density()
        self.last_plan: RankPlan | None = None

    segment_lengths = property(lambda self: self.pattern.segment_lengths)
    dilation_rates = property(lambda self: self.pattern.dilation_rates)
    semantics = property(lambda self: self.pattern.semantics)
    block_size = property(lambda self: self.pattern.block_size)

    # the pattern -------------------------------------------------------------------------------------
    def block_table(self, seq_len: int, num_heads: int) -> torch.Tensor:
        """(num_blocks, num_blocks) bool, True = attend; from the pattern cache."""
        return self.cached(("block_table", self.pattern, seq_len, num_heads), lambda: self.pattern.table(seq_len, num_heads))

    def _shape(self, seq_len: int | None, num_heads: int | None) -> tuple[int, int]:
        if seq_len is None:
            if self.last_shape is None:
                raise ValueError("density() before any forward call: pass seq_len (and num_heads for 'longnet')")
            return self.last_shape
        return seq_len, num_heads if num_heads is not None else (self.last_shape or (0, 1))[1]

    def density(self, seq_len: int | None = None, num_heads: int | None = None) -> float:
        """Active blocks / all blocks of the N x N block grid (default: the last call's shape)."""
        return self.block_table(*self._shape(seq_len, num_heads)).float().mean().item()

    def element_density(self, seq_len: int | None = None, num_heads: int | None = None, is_causal: bool = False) -> float:
        """Attended (query, key) pairs / N²: what the work really scales with (ragged and causal exact)."""
        n, h = self._shape(seq_len, num_heads)
        return attended_pairs(self.block_table(n, h), n, self.block_size, is_causal) / (n * n)

    def attended_pairs(self, seq_len: int, num_heads: int, is_causal: bool = False) -> int:
        """P of the FLOP convention for one batch item: pairs over heads."""
        return num_heads * attended_pairs(self.block_table(seq_len, num_heads), seq_len, self.block_size, is_causal)

    def reference(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
        *, key_padding_mask: torch.Tensor | None = None, compute_dtype: torch.dtype = torch.float64,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The dense reference with this module's block table (whole sequence), differentiable."""
        table = self.block_table(q.shape[1], q.shape[2])
        return block_sparse_reference(q, k, v, table, self.block_size, is_causal, self.scale,
                                      key_padding_mask=key_padding_mask, compute_dtype=compute_dtype)

    # execution -------------------------------------------------------------------------------------
    def _choose_executor(self, q: torch.Tensor, world: int, need_grad: bool, need_lse: bool, masked: bool) -> tuple[str, str]:
        if self.executor == "gather":
            return "gather", "requested"
        blockers = []
        if world > 1:
            blockers.append("the ring form receives key blocks from other ranks")
        if masked:
            blockers.append("a key_padding_mask is given")
        if self.training and self.dropout > 0:
            blockers.append("dropout is active")
        if q.device.type == "cpu" and need_grad:
            blockers.append("torch compiles FlexAttention on CPU for inference only")
        if q.device.type == "cpu" and need_lse:
            blockers.append("compiled CPU FlexAttention returns no logsumexp")
        if not flex_compiles_on(q.device):
            blockers.append(f"no compiler for FlexAttention on {q.device.type} (triton / a C++ compiler)")
        if self.executor == "flex":
            if blockers:
                raise ValueError(f"executor='flex' cannot run this call: {'; '.join(blockers)}; use executor='auto'")
            return "flex", "requested"
        if blockers:
            return "gather", "; ".join(blockers)
        if q.device.type == "cpu":
            return "gather", ("on CPU the gather path was faster than compiled FlexAttention in "
                              "benchmarks/block_sparse.py; executor='flex' forces it")
        return "flex", f"FlexAttention compiled for {q.device.type}"

    def forward_with_lse(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
        *, key_padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, lse) of this rank's shard (the whole sequence without a process group)."""
        return self._forward(q, k, v, is_causal, key_padding_mask, need_lse=True)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
        *, key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q, k, v: (batch, seq_len, heads, head_dim) (a shard of N/p in the ring form) -> out, same shape."""
        return self._forward(q, k, v, is_causal, key_padding_mask, need_lse=False)[0]

    def _forward(self, q, k, v, is_causal, key_padding_mask, need_lse):
        check_qkv(q, k, v)
        batch, shard, num_heads, _ = q.shape
        check_key_padding_mask(key_padding_mask, batch, shard, q.device)
        rank, world = group_rank_size(self.process_group)
        seq_len = shard * world
        if world > 1 and shard % self.block_size:
            raise ValueError(
                f"{type(self).__name__}: the shard length N/p = {shard} is not a multiple of block_size="
                f"{self.block_size}: use N divisible by p * block_size, or a block_size dividing {shard}"
            )
        self.last_shape = (seq_len, num_heads)
        table = self.block_table(seq_len, num_heads)
        need_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        executor, reason = self._choose_executor(q, world, need_grad, need_lse, key_padding_mask is not None)
        self.last_executor = (executor, reason)
        if executor == "flex":
            self.last_backend = ("flex_attention", "FlexAttention computes the whole pattern in one kernel")
            mask = self.cached(("flex_block_mask", self.pattern, seq_len, num_heads, bool(is_causal), str(q.device)),
                               lambda: flex_block_mask(table, seq_len, self.block_size, is_causal, q.device))
            scale = q.shape[-1] ** -0.5 if self.scale is None else float(self.scale)
            return flex_forward(q, k, v, mask, scale, need_lse=need_lse)
        if world > 1:
            config = f"{self.pattern}|{is_causal}|{key_padding_mask is not None}|{self.dropout}|{self.training}"
            check_consistent(self.process_group, type(self).__name__, tuple(q.shape), q.dtype, config, q.device)
            self.stats.call()
        backend, call, pool = self.prepare_call(q, is_causal, key_padding_mask is not None)
        plan = self.cached(("block_plan", self.pattern, seq_len, num_heads, bool(is_causal), rank, world, str(q.device)),
                           lambda: plan_rank(table, seq_len, self.block_size, rank, world, is_causal, q.device))
        self.last_plan = plan
        exchange = BlockSparseExchange(plan, self.block_size, self.process_group, self.stats)
        engine = BlockAttention([], ViewAccess(pool), backend, call, pool, exchange)
        return block_attention(q, k, v, key_padding_mask, engine)

    # distributed accounting and reporting -----------------------------------------------------------
    def received_blocks(self) -> dict[int, tuple[int, ...]]:
        """Source rank -> the global key blocks this rank received from it on the last (gather) call."""
        return dict(self.last_plan.receive) if self.last_plan else {}

    def comm_stats(self) -> dict[str, int]:
        return self.stats.snapshot()

    def comm_volume(self, seq_len: int, num_heads: int, head_dim: int, batch: int, element_size: int,
                    is_causal: bool = False, masked: bool = False) -> dict[str, int]:
        """Bytes each rank sends and receives per forward and backward call: exactly the K/V rows (and
        key-mask values) of the blocks other ranks' queries use, and their dK/dV shares back."""
        rank, world = group_rank_size(self.process_group)
        if world == 1:
            return {"forward_bytes_sent": 0, "forward_bytes_received": 0, "backward_bytes_sent": 0,
                    "backward_bytes_received": 0}
        plan = plan_rank(self.block_table(seq_len, num_heads), seq_len, self.block_size, rank, world, is_causal,
                         torch.device("cpu"))
        per_row = batch * (2 * num_heads * head_dim) * element_size
        mask_row = batch * element_size if masked else 0
        sent_rows = sum(rows.numel() for rows in plan.send.values())
        received_rows = sum(len(b) * self.block_size for b in plan.receive.values())
        return {
            "forward_bytes_sent": sent_rows * (per_row + mask_row),
            "forward_bytes_received": received_rows * (per_row + mask_row),
            "backward_bytes_sent": received_rows * per_row,
            "backward_bytes_received": sent_rows * per_row,
        }

    def describe(self) -> str:
        _, world = group_rank_size(self.process_group)
        n = self.last_shape[0] if self.last_shape else None
        parts = [f"{type(self).__name__}: pattern {self.pattern.describe(n)}"]
        if self.last_shape:
            parts.append(f"density {self.density():.4f} of blocks, {self.element_density():.4f} of (query, key) pairs "
                         f"at N={self.last_shape[0]}")
        if self.last_executor:
            parts.append(f"executor {self.executor} -> {self.last_executor[0]} on the last call ({self.last_executor[1]})")
        else:
            parts.append(f"executor {self.executor} (flex or gather, chosen per call)")
        parts.append(self.describe_backend())
        if world > 1:
            parts.append(f"ring form over {world} ranks: each rank receives only the key blocks its queries use")
        if self.selection_reason:
            parts.insert(0, self.selection_reason)
        return "; ".join(parts)

    def extra_repr(self) -> str:
        return f"pattern={self.pattern.describe()!r}, executor={self.executor!r}, backend={self.backend!r}"
