"""The gather executor of block-sparse attention (attention.py): the backend calls of a block table.

For each query block, its active key blocks as one call: a slice when they are contiguous, an index
gather otherwise; the causal diagonal block as a second call. Partial results merge with the shared
merge routine through the engine's autograd boundary (engine.py), whose backward hands every call the
merged out and lse. `plan_parts` lists the calls (`Part`) against one source of key blocks;
`attend_parts` and `attend_parts_backward` run them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..backends import BACKENDS
from ..engine import BlockAttention
from ..merge import merge_partial_

KeyRows = slice | torch.Tensor  # rows of a key source: a contiguous range, or gathered by index
# query rows of one coalesced call: on 2 CPU threads, 64 calls of 128 query rows against 8,192 keys (H = 8,
# D = 64, fp32, fwd+bwd) took 2.6x the time of one call of all 8,192 rows; larger calls hold more of out and dq
MAX_COALESCED_ROWS = 2048


@dataclass(frozen=True)
class Part:
    """One backend call: local query rows against key rows of one source."""

    queries: slice
    keys: KeyRows
    causal: bool
    stream: tuple[int, int]  # (set, member) of its dropout stream: engine.dropout_stream


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


def _block_rows(position: int, block_size: int, total_rows: int) -> tuple[int, int]:
    return position * block_size, min((position + 1) * block_size, total_rows)


def plan_parts(
    table: torch.Tensor,
    query_blocks: Sequence[int],
    query_rows: int,
    source_blocks: Sequence[int],
    source_rows: int,
    block_size: int,
    causal: bool,
    device: torch.device,
    source_id: int = 0,
) -> tuple[Part, ...]:
    """The calls of `query_blocks` (global ids, local rows from 0) against a source holding the global key
    blocks `source_blocks` in order (rows position·block_size ...)."""
    source = torch.tensor(list(source_blocks), dtype=torch.long)
    where = {g: i for i, g in enumerate(source_blocks)}
    gathered: dict[tuple[int, ...], torch.Tensor] = {}  # one index tensor per key set: equal keys are the same object
    parts = []
    for qi, g in enumerate(query_blocks):
        queries = slice(*_block_rows(qi, block_size, query_rows))
        active = table[g, source].clone()
        if causal:
            active &= source <= g
        stream = (qi, source_id)  # dropout: the shard's query block; whose keys (0 own, 1 own diagonal, 2 + rank)
        if causal and g in where and active[where[g]]:
            active[where[g]] = False
            parts.append(Part(queries, slice(*_block_rows(where[g], block_size, source_rows)), True, (qi, 1)))
        positions = active.nonzero().flatten().tolist()
        if not positions:
            continue
        if positions[-1] - positions[0] + 1 == len(positions):  # contiguous: a slice, no copy
            keys: KeyRows = slice(
                _block_rows(positions[0], block_size, source_rows)[0],
                _block_rows(positions[-1], block_size, source_rows)[1],
            )
        elif (keys := gathered.get(tuple(positions))) is None:
            keys = torch.cat([torch.arange(*_block_rows(p, block_size, source_rows)) for p in positions]).to(device)
            gathered[tuple(positions)] = keys
        parts.append(Part(queries, keys, False, stream))
    return tuple(parts)


def coalesce(parts: Sequence[Part], max_rows: int = MAX_COALESCED_ROWS) -> tuple[Part, ...]:
    """Runs of non-causal parts over adjacent query rows with the same keys as one call of at most `max_rows`
    rows (a dilated or segment-local table repeats a key set over many query blocks). Not under dropout: a
    part's dropout stream is its own query block's."""
    merged: list[Part] = []
    for part in parts:
        last = merged[-1] if merged else None
        if (
            last is not None
            and not (last.causal or part.causal)
            and last.queries.stop == part.queries.start
            and part.queries.stop - last.queries.start <= max_rows
            and (last.keys is part.keys or (isinstance(last.keys, slice) and last.keys == part.keys))
        ):
            merged[-1] = Part(slice(last.queries.start, part.queries.stop), last.keys, False, last.stream)
        else:
            merged.append(part)
    return tuple(merged)


def attend_parts(attention: BlockAttention, parts, q, k, v, key_pad, out, lse) -> None:
    """q, k, v (B, H, rows, D); merge every part's (out, lse) into the fp32 accumulators out (B, N, H, D)
    and lse (B, N, H)."""
    backend = BACKENDS[attention.backend]
    for part in parts:
        qb = q[:, :, part.queries]
        kb, vb = _rows(k, part.keys), _rows(v, part.keys)
        pad = None if key_pad is None else _rows(key_pad, part.keys, 1)
        block_out, block_lse = backend.forward(qb, kb, vb, pad, attention._call(*part.stream, causal=part.causal))
        merge_partial_(out[:, part.queries], lse[:, part.queries], block_out.transpose(1, 2), block_lse.transpose(1, 2))


def attend_parts_backward(attention: BlockAttention, parts, dout, q, out, lse, k, v, key_pad, dq, dk, dv) -> None:
    """Each part's gradient share with the merged out and lse, added into dq and the source's dk, dv; every
    tensor (B, H, rows, D), lse (B, H, rows)."""
    backend = BACKENDS[attention.backend]
    for part in parts:
        qb, dob, ob, lb = (x[:, :, part.queries] for x in (q, dout, out, lse))
        kb, vb = _rows(k, part.keys), _rows(v, part.keys)
        pad = None if key_pad is None else _rows(key_pad, part.keys, 1)
        dq_part, dk_part, dv_part = backend.backward(
            dob, qb, kb, vb, ob, lb, pad, attention._call(*part.stream, causal=part.causal)
        )
        dq[:, :, part.queries].add_(dq_part)
        _add_rows(dk, part.keys, dk_part)
        _add_rows(dv, part.keys, dv_part)
