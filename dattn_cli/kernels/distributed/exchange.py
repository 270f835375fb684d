"""The one exchange layer: point-to-point transfers inside a process group, and the one wire format of
K/V rows with their key-mask rows.

* `exchange` posts sends and receives to ranks of the group (batch_isend_irecv) and counts the bytes of the
  tensors it hands to torch.distributed in the module's CommStats: bytes are counted, never derived from a
  formula, so comparing them with the closed forms (`comm_volume`) is a real check.
* `pack_rows` / `unpack_rows`: K rows, V rows and, if any, the key-mask rows (0/1 in K's dtype) in one flat
  buffer; dK/dV shares travel the same way without a mask. `packed_elements` is that buffer's size, the
  one byte rule of every rows-plus-mask transfer (ring, all-gather, block-sparse ring, halo) and of the
  formulas that predict them (comm_volume, workload/counts.py, plan/memory.py).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .comm import CommStats


def global_rank(group, rank: int) -> int:
    """A rank of `group` as the global rank that point-to-point calls take."""
    return rank if group is None else dist.get_global_rank(group, rank)


def exchange(
    sends: dict[int, torch.Tensor],
    receives: dict[int, torch.Tensor],
    group,
    stats: CommStats,
    tag: int,
    phase: str,
    wait: bool = True,
) -> list:
    """Send sends[r] to and receive receives[r] from rank r of `group`; the bytes of both counted in `stats`
    under `phase`. wait=False returns the works to wait on (to overlap the transfer with compute)."""
    sends = {r: buf.contiguous() for r, buf in sends.items()}
    ops = [dist.P2POp(dist.isend, buf, global_rank(group, r), group, tag) for r, buf in sends.items()]
    ops += [dist.P2POp(dist.irecv, buf, global_rank(group, r), group, tag) for r, buf in receives.items()]
    stats.add(phase, tensor_bytes(*sends.values()), tensor_bytes(*receives.values()))
    works = dist.batch_isend_irecv(ops) if ops else []
    if not wait:
        return works
    for work in works:
        work.wait()
    return []


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def packed_elements(batch: int, heads: int, head_dim: int, rows: int, masked: bool = False) -> int:
    """Elements of `rows` packed K/V rows of `heads` heads (and one mask value per row and batch item)."""
    return batch * rows * (2 * heads * head_dim + (1 if masked else 0))


def pack_rows(k: torch.Tensor, v: torch.Tensor, key_pad: torch.Tensor | None = None) -> torch.Tensor:
    """k, v rows (any layout, unpacked by their shape) and the key-mask rows as 0/1 values, in one buffer."""
    parts = [k.reshape(-1), v.reshape(-1)]
    if key_pad is not None:
        parts.append(key_pad.to(k.dtype).reshape(-1))
    return torch.cat(parts)


def unpack_rows(buffer: torch.Tensor, shape: tuple[int, ...], mask_shape: tuple[int, ...] | None = None):
    """(k, v, key_pad) views of a `pack_rows` buffer: k and v of `shape`, the mask (bool) of `mask_shape`."""
    size = math.prod(shape)
    key_pad = None
    if mask_shape is not None:
        key_pad = buffer[2 * size : 2 * size + math.prod(mask_shape)].view(mask_shape) > 0.5
    return buffer[:size].view(shape), buffer[size : 2 * size].view(shape), key_pad
