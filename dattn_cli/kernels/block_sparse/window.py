"""Token-level sliding window: query t attends key u when t - left <= u <= t + right (causal: and u <= t).

The banded executor: query rows in chunks of `c` (16 .. 64); a chunk's keys are one contiguous slice (its rows' windows
together), so every query's whole window is in one dense call: no merge, and work O(N·(c + left + right))
(c is at most the window, so O(N x window)). The autograd boundary is the engine's (BandAttention): forward
keeps only out and lse, backward recomputes each chunk's probabilities from lse (as FlashAttention does), so
memory stays O(N) besides one chunk's scores. Scores in fp32 (fp64 for fp64 inputs); a query with no key
outputs 0 with lse -inf.

Positions are global: q row i is position q_start + i, k row j is position k_start + j (a rank of the
ring form passes its shard with the halo rows around it, halo.py).

`sliding_window_call` is the pattern's path through the block-sparse module (attention.py): the patterns
with a token window (patterns.py, `token_level`) run here, not on the flex or gather executors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..backends import accumulator_dtype
from ..distributed.comm import check_call
from ..engine import block_attention
from ..heads import heads_first
from .halo import HaloExchange, plan_halo

BAND_REASON = "a token window needs per-token masks: the banded executor, exact, O(N x window)"

# Query rows per chunk: the window's width, between 16 and 64. Measured (N=4096, H=8, D=64, fp32, this CPU): a window
# of 64 each side ran fastest at 64 rows (fwd 40 ms; 512 rows: 114 ms), one of 256 each side at 64 rows too (62 ms;
# 512 rows: 154 ms): wider chunks compute more pairs outside the band, narrower ones more, smaller calls.
MIN_CHUNK, MAX_CHUNK = 16, 64


@dataclass(frozen=True)
class Window:
    left: int
    right: int
    causal: bool
    scale: float
    q_start: int = 0
    k_start: int = 0

    @property
    def reach(self) -> int:
        """Keys after a query that it may attend."""
        return 0 if self.causal else self.right

    def chunk(self) -> int:
        return max(MIN_CHUNK, min(MAX_CHUNK, self.left + self.reach + 1))

    def key_range(self, first: int, last: int, keys: int) -> tuple[int, int]:
        """Local key rows [lo, hi) that queries at local rows first .. last - 1 may attend."""
        lo = self.q_start + first - self.left - self.k_start
        hi = self.q_start + last + self.reach - self.k_start
        return max(0, lo), min(keys, hi)

    def allowed(self, first: int, last: int, lo: int, hi: int, device) -> torch.Tensor:
        """(rows, keys) bool: the band (and causality) for query rows first .. last - 1, key rows lo .. hi - 1."""
        t = torch.arange(first, last, device=device)[:, None] + self.q_start
        u = torch.arange(lo, hi, device=device)[None, :] + self.k_start
        return (u >= t - self.left) & (u <= t + self.reach)


def _chunks(window: Window, rows: int, keys: int):
    c = window.chunk()
    for first in range(0, rows, c):
        last = min(rows, first + c)
        yield first, last, *window.key_range(first, last, keys)


def _scores(q, k, key_pad, window: Window, first, last, lo, hi) -> torch.Tensor:
    """(B, H, rows, keys) scaled scores, -inf outside the band or on masked keys."""
    acc = accumulator_dtype(q.dtype)
    s = torch.matmul(q[:, :, first:last].to(acc), k[:, :, lo:hi].to(acc).transpose(-1, -2)) * window.scale
    keep = window.allowed(first, last, lo, hi, q.device)[None, None]
    if key_pad is not None:
        keep = keep & ~key_pad[:, None, None, lo:hi]
    return s.masked_fill(~keep, float("-inf"))


def window_forward(q, k, v, key_pad, window: Window) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H, M, D), k, v (B, H, K, D) heads first -> out (B, H, M, D), lse (B, H, M) in the score dtype."""
    acc = accumulator_dtype(q.dtype)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=acc, device=q.device)
    for first, last, lo, hi in _chunks(window, q.shape[2], k.shape[2]):
        if hi <= lo:
            continue
        s = _scores(q, k, key_pad, window, first, last, lo, hi)
        m = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - m.nan_to_num(neginf=0.0)[..., None])  # rows without keys: exp(-inf) = 0
        out[:, :, first:last] = torch.matmul(p, v[:, :, lo:hi].to(acc)).to(q.dtype)
        lse[:, :, first:last] = m
    return out, lse


def window_backward(dout, q, k, v, out, lse, key_pad, window: Window):
    """dq, dk, dv of window_forward (heads first), probabilities recomputed from lse chunk by chunk."""
    acc = accumulator_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=k.device)
    dv = torch.zeros(v.shape, dtype=acc, device=v.device)
    delta = (dout.to(acc) * out.to(acc)).sum(-1)  # rowsum(dO * O), the softmax backward's correction
    for first, last, lo, hi in _chunks(window, q.shape[2], k.shape[2]):
        if hi <= lo:
            continue
        s = _scores(q, k, key_pad, window, first, last, lo, hi)
        p = torch.exp(s - lse[:, :, first:last, None].nan_to_num(neginf=0.0))
        do = dout[:, :, first:last].to(acc)
        dv[:, :, lo:hi] += torch.matmul(p.transpose(-1, -2), do)
        ds = p * (torch.matmul(do, v[:, :, lo:hi].to(acc).transpose(-1, -2)) - delta[:, :, first:last, None])
        dq[:, :, first:last] = torch.matmul(ds, k[:, :, lo:hi].to(acc)) * window.scale
        dk[:, :, lo:hi] += torch.matmul(ds.transpose(-1, -2), q[:, :, first:last].to(acc)) * window.scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@dataclass(frozen=True)
class BandAttention:
    """The banded executor behind the engine's autograd boundary (engine.block_attention): forward and backward
    on (B, N, H, D) like BlockAttention, so GQA's repetition of K/V, the saved tensors and the lse stay the
    engine's. K may hold more rows than q (the halo of the ring form)."""

    window: Window

    def forward(self, q, k, v, key_pad=None) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = window_forward(*(heads_first(x) for x in (q, k, v)), key_pad, self.window)
        return out.transpose(1, 2), lse.transpose(1, 2)

    def backward(self, dout, q, k, v, out, lse, key_pad=None) -> tuple[torch.Tensor, ...]:
        transposed = [heads_first(x) for x in (dout, q, k, v, out)]
        grads = window_backward(*transposed, lse.transpose(1, 2), key_pad, self.window)
        return tuple(g.transpose(1, 2) for g in grads)


def sliding_window_attention(q, k, v, key_pad, window: Window) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, M, H, D), k, v (B, K, H or H_kv, D), key_pad (B, K) or None -> out (B, M, H, D), lse (B, M, H)
    float32/64."""
    return block_attention(q, k, v, key_pad, BandAttention(window))


def window_pairs(seq_len: int, left: int, right: int, causal: bool) -> int:
    """(query, key) pairs of one (batch, head): over t, the keys in [t - left, t + right] (causal: up to t)
    within [0, N)."""
    t = torch.arange(seq_len, dtype=torch.int64)
    lo = (t - left).clamp(min=0)
    hi = (t + (0 if causal else right)).clamp(max=seq_len - 1)
    return int((hi - lo + 1).clamp(min=0).sum())


def sliding_window_call(module, q, k, v, is_causal, key_padding_mask, rank: int, world: int):
    """(out, lse) of the block-sparse `module`'s token-window pattern on this rank's shard q, k, v (B, L, H, D):
    the banded executor; in the ring form (world > 1) with the halo rows of the neighbours (halo.py), which
    travel at the kv heads."""
    name = module.pattern.name
    if module.training and module.dropout > 0:
        raise ValueError(f"pattern={name!r} runs without dropout: use dropout=0.0 (or eval())")
    if module.executor == "flex":
        raise ValueError(f"pattern={name!r} runs on its banded executor: use executor='auto' or 'gather'")
    _, shard, heads, head_dim = q.shape
    scale = head_dim**-0.5 if module.scale is None else float(module.scale)
    start = rank * shard
    window = Window(*module.pattern.token_window, bool(is_causal), scale, q_start=start, k_start=start)
    module.last_shape, module.last_executor = (shard * world, heads), ("band", BAND_REASON)
    module.last_backend = ("band", "chunked matmuls of the banded executor")
    if world > 1:
        group = module.process_group
        check_call(module, q, k, is_causal, key_padding_mask)
        module.stats.call()
        plan = plan_halo(rank, world, shard, window.left, window.reach)
        k, v, key_padding_mask = HaloExchange.apply(k, v, key_padding_mask, plan, group, module.stats)
        window = dataclasses.replace(window, k_start=plan.start - plan.before)
    return sliding_window_attention(q, k, v, key_padding_mask, window)
