"""Dense references (docs/semantics.md), built straight from the definitions: dilated attention, and attention
restricted by a block table (block-sparse patterns).

For every (query, key, head) it counts c_h(t, u), the pairs under which t attends u, and computes
one softmax with an additive log c bias (−inf where c = 0). Work is done in float64, a chunk of query
rows at a time, so at most `max_block_elements` scores exist at once. It does not use the block
decomposition of `pattern.py`, so it is an independent check of the implementations.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .heads import expand_kv
from .pattern import check_head_groups, validate_pattern
from .validation import check_qkv

DEFAULT_MAX_BLOCK_ELEMENTS = 1 << 22


def pair_offsets(
    head: int, num_heads: int, segment_lengths: Sequence[int], dilation_rates: Sequence[int], semantics: str
) -> list[tuple[int, int, int]]:
    """(segment length, rate, offset) of every pair that head uses."""
    m = len(segment_lengths)
    if semantics == "longnet":
        return [(w, r, head % r) for w, r in zip(segment_lengths, dilation_rates)]
    base, extra = divmod(num_heads, m)
    bounds = [0]
    for i in range(m):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    group = next(i for i in range(m) if bounds[i] <= head < bounds[i + 1])
    return [(segment_lengths[group], dilation_rates[group], group % dilation_rates[group])]


def pair_counts(
    rows: torch.Tensor,
    seq_len: int,
    num_heads: int,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    semantics: str,
    is_causal: bool,
) -> torch.Tensor:
    """c_h(t, u) for t in `rows`, all u: int tensor (H, len(rows), N)."""
    keys = torch.arange(seq_len, device=rows.device)
    counts = torch.zeros(num_heads, rows.numel(), seq_len, dtype=torch.int32, device=rows.device)
    for h in range(num_heads):
        for w, r, offset in pair_offsets(h, num_heads, segment_lengths, dilation_rates, semantics):
            w_hat = min(w, seq_len)
            kept_t = (rows % w_hat) % r == offset
            kept_u = (keys % w_hat) % r == offset
            same_segment = (rows // w_hat).unsqueeze(1) == (keys // w_hat).unsqueeze(0)
            attend = kept_t.unsqueeze(1) & kept_u.unsqueeze(0) & same_segment
            if is_causal:
                attend &= keys.unsqueeze(0) <= rows.unsqueeze(1)
            counts[h] += attend.int()
    return counts


def dilated_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    is_causal: bool = False,
    semantics: str = "longnet",
    scale: float | None = None,
    *,
    key_padding_mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float64,
    max_block_elements: int = DEFAULT_MAX_BLOCK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (out (B, N, H, D) in q's dtype, lse (B, N, H) float32). k, v: (B, N, H_kv, D), H_kv dividing H.

    key_padding_mask: optional bool (B, N), True = that key takes part in no softmax.
    compute_dtype: float64 for the reference; the input's own dtype gives the "naive same-dtype
    dense computation" that half-precision tolerances are measured against.
    Differentiable: gradients flow through autograd in compute_dtype.
    """
    segs, rates = validate_pattern(segment_lengths, dilation_rates, semantics)
    check_qkv(q, k, v)
    batch, seq_len, num_heads, head_dim = q.shape
    check_head_groups(semantics, num_heads, len(segs))
    return _masked_softmax_attention(
        q,
        k,
        v,
        scale,
        key_padding_mask,
        compute_dtype,
        max_block_elements,
        lambda rows: torch.log(
            pair_counts(rows, seq_len, num_heads, segs, rates, semantics, is_causal).to(compute_dtype)
        ),
    )


def block_sparse_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    key_padding_mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float64,
    max_block_elements: int = DEFAULT_MAX_BLOCK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention restricted by a block table (True = query block attends key block): one softmax
    per query over every key of its active blocks (and, causal, not after it). Returns (out, lse) like
    `dilated_attention_reference`; rows with no key output 0 with lse -inf."""
    check_qkv(q, k, v)
    table = check_block_table(block_table, q.shape[1], block_size).to(q.device)
    keys = torch.arange(q.shape[1], device=q.device)

    def allowed(rows):
        allowed = table[rows // block_size][:, keys // block_size]
        return allowed & (keys.unsqueeze(0) <= rows.unsqueeze(1)) if is_causal else allowed

    return _masked_softmax_attention(q, k, v, scale, key_padding_mask, compute_dtype, max_block_elements, allowed)


def check_block_table(table: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    """`table` if it is the bool (blocks, blocks) table of N = seq_len in blocks of block_size, else ValueError."""
    blocks = -(-seq_len // block_size)
    if tuple(table.shape) != (blocks, blocks) or table.dtype != torch.bool:
        raise ValueError(
            f"block_table must be bool ({blocks}, {blocks}) for N={seq_len}, block_size={block_size}; "
            f"got {table.dtype} {tuple(table.shape)}"
        )
    return table


def sliding_window_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    left: int,
    right: int,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    key_padding_mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float64,
    max_block_elements: int = DEFAULT_MAX_BLOCK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention where query t sees keys t - left .. t + right (causal: .. t); (out, lse) like the others."""
    check_qkv(q, k, v)
    keys = torch.arange(q.shape[1], device=q.device)
    reach = 0 if is_causal else right

    def allowed(rows):
        return (keys[None, :] >= rows[:, None] - left) & (keys[None, :] <= rows[:, None] + reach)

    return _masked_softmax_attention(q, k, v, scale, key_padding_mask, compute_dtype, max_block_elements, allowed)


def _masked_softmax_attention(q, k, v, scale, key_padding_mask, compute_dtype, max_block_elements, row_bias):
    """One softmax per query over all keys with the additive bias `row_bias(rows)` ((H, rows, N); -inf = not
    attended), or where the bool (rows, N) `row_bias(rows)` allows, a chunk of query rows at a time, in
    compute_dtype."""
    batch, seq_len, num_heads, head_dim = q.shape
    tau = head_dim**-0.5 if scale is None else scale
    qc, kc, vc = (x.to(compute_dtype).transpose(1, 2) for x in (q, k, v))  # (B, H, N, D)
    kc, vc = expand_kv(kc, vc, num_heads, dim=1)  # GQA/MQA: query head h attends with kv head h // (H / H_kv)
    key_bias = None
    if key_padding_mask is not None:
        key_bias = torch.zeros(batch, 1, 1, seq_len, dtype=compute_dtype, device=q.device)
        key_bias = key_bias.masked_fill(key_padding_mask.view(batch, 1, 1, seq_len), float("-inf"))
    chunk = max(1, max_block_elements // max(1, batch * num_heads * seq_len))
    outs, lses = [], []
    for t0 in range(0, seq_len, chunk):
        rows = torch.arange(t0, min(seq_len, t0 + chunk), device=q.device)
        bias = row_bias(rows)
        if bias.dtype == torch.bool:  # the same for every head
            bias = torch.zeros((), dtype=compute_dtype, device=q.device).masked_fill(~bias, float("-inf"))
        scores = torch.matmul(qc[:, :, rows], kc.transpose(-1, -2)) * tau + bias
        if key_bias is not None:
            scores = scores + key_bias
        # Rows with no key at all (kept by no pair, or every key padded) output 0 with lse -inf;
        # they are computed on zeroed scores so that no NaN reaches the gradients.
        dead = (scores == float("-inf")).all(dim=-1, keepdim=True)
        scores = scores.masked_fill(dead, 0.0)
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        probs = torch.exp(scores - lse).masked_fill(dead, 0.0)
        outs.append(torch.matmul(probs, vc))
        lses.append(lse.masked_fill(dead, float("-inf")).squeeze(-1))
    out = torch.cat(outs, dim=2).transpose(1, 2).to(q.dtype)
    lse = torch.cat(lses, dim=2).transpose(1, 2).float()
    return out, lse


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """Plain softmax attention on (B, N, H, D), for checks where the dilated pattern is dense."""
    tau = q.shape[-1] ** -0.5 if scale is None else scale
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    scores = torch.matmul(qt, kt.transpose(-1, -2)) * tau
    if is_causal:
        n = q.shape[1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), vt).transpose(1, 2)
