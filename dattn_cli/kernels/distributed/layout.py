"""Which positions of the whole (padded) sequence each rank holds: the shard layout.

* contiguous (default): rank a holds positions [a·L, (a+1)·L), one chunk of L = N'/p.
* zigzag: the padded sequence is cut into 2p chunks of C = L/2 and rank a holds chunks a and 2p-1-a, in
  that order (its first L/2 rows are chunk a, its last L/2 rows chunk 2p-1-a). With a causal mask a rank
  then holds one early and one late chunk, so every rank attends about the same number of pairs.

N not divisible by 2p (or not aligned with the pattern): shard_sequence pads at the end to N' = 2p·C, as for
contiguous shards (sharding.py); the padding therefore lies in the last chunks, 2p-1, 2p-2, ..., held by
ranks 0, 1, ... It is masked, so the result is exact; those ranks hold a little less real work.

* documents: packed documents (cu_seqlens) balanced across ranks, a layout that depends on the documents
  (document_layout.py); the sequence-parallel modules take it, and the sharding functions with cu_seqlens.
"""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "zigzag")
DOCUMENTS = "documents"


def check_layout(layout, name: str = "layout", documents: bool = False) -> str:
    """The layout name, or a ValueError; documents: the caller also takes layout="documents"."""
    known = (*LAYOUTS, DOCUMENTS) if documents else LAYOUTS
    if layout not in known:
        raise ValueError(f"{name}={layout!r} is unknown: use one of {', '.join(known)}")
    return layout


def chunk_count(world: int, layout: str) -> int:
    """How many equal chunks the padded sequence is cut into: p (contiguous) or 2p (zigzag)."""
    return 2 * world if check_layout(layout) == "zigzag" else world


def chunks_per_rank(world: int, layout: str) -> int:
    """Chunks one rank's shard is made of: 1, or 2 under zigzag over several ranks."""
    return 2 if check_layout(layout) == "zigzag" and world > 1 else 1


def rank_chunks(rank: int, world: int, layout: str) -> tuple[int, ...]:
    """The chunks rank `rank` holds, in the order of its rows."""
    return (rank, 2 * world - 1 - rank) if check_layout(layout) == "zigzag" else (rank,)


def chunk_owner(chunk: int, world: int, layout: str) -> tuple[int, int]:
    """(rank, index among its chunks) of chunk `chunk`."""
    if check_layout(layout) == "zigzag" and chunk >= world:
        return 2 * world - 1 - chunk, 1
    return chunk, 0


def rank_positions(rank: int, world: int, length: int, layout: str, device=None) -> torch.Tensor:
    """Global positions of the `length` rows rank `rank` holds (its shard), in row order."""
    if world == 1:  # one rank holds every chunk, in order, whatever the layout
        return torch.arange(length, device=device)
    chunks = rank_chunks(rank, world, layout)
    if length % len(chunks):
        raise ValueError(
            f"shard length {length} is odd: layout={layout!r} needs an even shard length (two chunks per rank); "
            "use padded_length(N, world, ..., layout=layout) // world"
        )
    size = length // len(chunks)
    return torch.cat([torch.arange(c * size, (c + 1) * size, device=device) for c in chunks])


def sequence_order(world: int, length: int, layout: str) -> torch.Tensor:
    """Where each position of the whole sequence sits in the ranks' shards concatenated in rank order."""
    held = torch.cat([rank_positions(rank, world, length, layout) for rank in range(world)])
    return torch.argsort(held)
