"""Block-local references: the definitions of docs/semantics.md (dilated attention) and docs/block-sparse.md
(attention restricted by a block table; the token sliding window), computed a chunk of query rows at a time
over only the keys that chunk can attend.

Each chunk takes one softmax over its keys with an additive bias (log c for the dilated pair count, 0 where a
block table or window allows, -inf elsewhere), exactly as the dense references (reference.py) do over all N
keys; keys outside the chunk's range have c = 0 there, so the two compute the same function. The backward is
written out (FlashAttention's recomputation: each chunk's probabilities again from the saved lse), so memory
is q, k, v, out, lse and the gradients, O(B x N x H x D), plus one chunk's scores (`max_chunk_elements`),
not O(N^2) and not O(N x window x H). Work is each chunk's rows times its key range: N x max(segment) for the
dilated pattern, N x (left + right + chunk) for the window, the table's key blocks for a block table.

Written from the documents, not from kernels/pattern.py or the engine; the dense references stay the
definitions, and tests/kernels/test_reference_local.py proves these equal to them on the awkward cases.
`compute_dtype` other than float64 gives the naive same-dtype computation (half precisions accumulate dK/dV
across chunks in float32, as one matmul would, so the chunking adds no rounding of its own).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from .documents import attend_documents
from .validation import check_key_padding_mask, check_qkv

DEFAULT_CHUNK_ELEMENTS = 1 << 22  # scores (B x H x rows x keys) per chunk: 32 MiB in float64
NEG_INF = float("-inf")


@dataclass(frozen=True)
class Chunk:
    start: int  # query rows [start, end)
    end: int
    keys: torch.Tensor  # 1-D int64, ascending: every key some row of the chunk may attend (for these heads)
    heads: torch.Tensor | None = None  # the query heads this chunk computes (None: all)
    rule: object = None  # restrict_(scores, rows, keys): the layout's mask for these heads (None: the layout's)


class _HeadClass:
    """Heads that use every pair with the same offset: one key set and one count c(t, u) for all of them."""

    def __init__(self, n, pairs, causal, heads, device):
        self.n, self.pairs, self.causal, self.heads, self.device = n, pairs, causal, heads, device

    def keys(self, t0: int, t1: int) -> torch.Tensor:
        """The keys some row in [t0, t1) attends: the kept keys of its segments, under any pair."""
        spans = [(t0 // w * w, min(self.n, ((t1 - 1) // w + 1) * w), w, r, o) for w, r, o in self.pairs]
        k0, k1 = min(s[0] for s in spans), max(s[1] for s in spans)
        positions = torch.arange(k0, min(k1, t1) if self.causal else k1, device=self.device)
        keep = torch.zeros_like(positions, dtype=torch.bool)
        for a, b, w, r, o in spans:
            keep |= (positions >= a) & (positions < b) & (positions % w % r == o)
        return positions[keep]

    def restrict_(self, scores: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """-inf where c(t, u) = 0, in place; returns c (rows, keys) when some pair may count twice."""
        counts = torch.zeros(rows.numel(), keys.numel(), dtype=torch.int8, device=self.device)
        first, last = int(rows[0]), int(rows[-1])
        for w, r, o in self.pairs:
            kept_t = (rows % w % r == o).view(-1, 1)
            kept_u = (keys % w % r == o).view(1, -1)
            if first // w == last // w:  # the chunk lies in one segment of this pair: its keys are one slice
                a, b = torch.searchsorted(
                    keys, torch.tensor([first // w * w, (first // w + 1) * w], device=keys.device)
                )
                counts[:, a:b] += kept_t & kept_u[:, a:b]
            else:
                counts += kept_t & kept_u & ((rows // w).view(-1, 1) == (keys // w).view(1, -1))
        if self.causal:
            counts.masked_fill_(keys.view(1, -1) > rows.view(-1, 1), 0)
        scores.masked_fill_(counts == 0, NEG_INF)
        return counts if len(self.pairs) > 1 else None


class _Dilated:
    """docs/semantics.md: pair i keeps position t for head h when pi_i(t) mod r_i = o_i(h); a kept query attends
    the kept keys of its own segment (causal: u <= t); c_h(t, u) counts the pairs that allow (t, u). Heads with
    the same offsets in every pair form a class (longnet: h mod lcm(r); head_groups: a group), computed together
    over only the keys its rows can attend."""

    def __init__(self, n, heads, segs, rates, semantics, causal, rows_per_chunk, device):
        self.n = n
        m = len(segs)
        group = [i for i in range(m) for _ in range(heads // m + (1 if i < heads % m else 0))]
        classes: dict[tuple, list[int]] = {}
        for h in range(heads):
            used = [(i, h % r if semantics == "longnet" else i % r) for i, r in enumerate(rates)]
            used = [(min(segs[i], n), rates[i], o) for i, o in used if semantics == "longnet" or group[h] == i]
            classes.setdefault(tuple(used), []).append(h)
        whole = len(classes) == 1
        self.classes = [
            _HeadClass(n, list(pairs), causal, None if whole else torch.tensor(hs, device=device), device)
            for pairs, hs in classes.items()
        ]
        self.widths = sorted({w for pairs in classes for w, _, _ in pairs})
        widest = self.widths[-1]
        self.rows = rows_per_chunk(min(n, widest), max(len(hs) for hs in classes.values()))
        if self.rows >= widest:  # whole segments per chunk: the key range is the rows' own
            self.rows -= self.rows % widest

    def chunks(self) -> Iterator[Chunk]:
        # a chunk never crosses a segment boundary of a pair whose segments are longer than a chunk
        bounds = set(range(0, self.n, self.rows)) | {self.n}
        for w in self.widths:
            if w > self.rows:
                bounds |= set(range(0, self.n, w))
        bounds = sorted(bounds)
        for t0, t1 in zip(bounds, bounds[1:]):
            for c in self.classes:
                yield Chunk(t0, t1, c.keys(t0, t1), c.heads, c)


class _Blocks:
    """docs/block-sparse.md: query t attends key u when table[t // b, u // b] (causal: and u <= t)."""

    def __init__(self, n, table, block_size, causal, rows_per_chunk, device):
        self.n, self.b, self.causal, self.device = n, block_size, causal, device
        self.table = table.to(device)
        widest = int(self.table.sum(dim=1).max().item()) * block_size if self.table.numel() else 1
        self.blocks = max(1, rows_per_chunk(max(1, min(n, widest))) // block_size)

    def chunks(self) -> Iterator[Chunk]:
        nb = self.table.shape[0]
        offsets = torch.arange(self.b, device=self.device)
        for i0 in range(0, nb, self.blocks):
            i1 = min(nb, i0 + self.blocks)
            t0, t1 = i0 * self.b, min(self.n, i1 * self.b)
            blocks = self.table[i0:i1].any(dim=0).nonzero().flatten()
            keys = (blocks.view(-1, 1) * self.b + offsets).flatten()
            keys = keys[keys < (t1 if self.causal else self.n)]
            yield Chunk(t0, t1, keys)

    def restrict_(self, scores: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor) -> None:
        allowed = self.table[rows // self.b][:, keys // self.b]
        if self.causal:
            allowed &= keys.view(1, -1) <= rows.view(-1, 1)
        scores.masked_fill_(~allowed, NEG_INF)


class _Window:
    """docs/block-sparse.md, sliding_window: query t attends keys t - left .. t + right (causal: .. t)."""

    def __init__(self, n, left, right, causal, rows_per_chunk, device):
        self.n, self.left, self.device = n, left, device
        self.reach = 0 if causal else right
        span = self.left + self.reach
        budget = rows_per_chunk(1)  # rows x keys the chunk may hold: rows (rows + span) <= budget
        self.rows = max(1, min(n, int(((span * span + 4 * budget) ** 0.5 - span) / 2)))

    def chunks(self) -> Iterator[Chunk]:
        for t0 in range(0, self.n, self.rows):
            t1 = min(self.n, t0 + self.rows)
            k0, k1 = max(0, t0 - self.left), min(self.n, t1 + self.reach)
            yield Chunk(t0, t1, torch.arange(k0, k1, device=self.device))

    def restrict_(self, scores: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor) -> None:
        gap = keys.view(1, -1) - rows.view(-1, 1)
        scores.masked_fill_((gap < -self.left) | (gap > self.reach), NEG_INF)


def _chunk_scores(q, k, v, key_mask, layout, chunk, scale):
    """Scale x q k^T (B, H, R, K) of the chunk's rows and keys, -inf where the layout or the key padding mask
    forbids; the pair counts c to weigh exp by (None: all 1); the chunk's q (B, H, R, D), and K and V
    repeated to the query heads (B, H, K, D)."""
    rows = torch.arange(chunk.start, chunk.end, device=q.device)
    qs = _heads(q[:, chunk.start : chunk.end], chunk.heads).transpose(1, 2)
    ks, vs = (x.index_select(1, chunk.keys) for x in (k, v))
    group = q.shape[2] // k.shape[2]
    if chunk.heads is not None:  # GQA/MQA: query head h attends with kv head h // group
        ks, vs = ks.index_select(2, chunk.heads // group), vs.index_select(2, chunk.heads // group)
    elif group > 1:
        ks, vs = ks.repeat_interleave(group, dim=2), vs.repeat_interleave(group, dim=2)
    ks, vs = ks.transpose(1, 2), vs.transpose(1, 2)
    scores = torch.matmul(qs, ks.transpose(-1, -2)).mul_(scale)
    counts = (chunk.rule or layout).restrict_(scores, rows, chunk.keys)
    if key_mask is not None:
        scores.masked_fill_(key_mask.index_select(1, chunk.keys).view(q.shape[0], 1, 1, -1), NEG_INF)
    return scores, counts, qs, ks, vs


def _heads(x: torch.Tensor, heads: torch.Tensor | None) -> torch.Tensor:
    """x (B, R, H, ...) at `heads` (None: all)."""
    return x if heads is None else x.index_select(2, heads)


def _put(target: torch.Tensor, start: int, end: int, heads: torch.Tensor | None, value: torch.Tensor) -> None:
    """target[:, start:end] (at `heads`) = value."""
    if heads is None:
        target[:, start:end] = value
    else:
        target[:, start:end].index_copy_(2, heads, value)


def _weights_(scores: torch.Tensor, shift: torch.Tensor, counts: torch.Tensor | None) -> torch.Tensor:
    """c x exp(scores - shift), in place of scores: the softmax numerators (c exp(s) = exp(s + log c))."""
    weights = scores.sub_(shift).exp_()
    return weights.mul_(counts) if counts is not None else weights


class _LocalAttention(torch.autograd.Function):
    """out, lse of the layout's attention on q (B, N, H, D), k, v (B, N, H_kv, D), all in the compute dtype."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, layout, scale):
        batch, n, heads, _ = q.shape
        out = torch.zeros_like(q)
        lse = torch.full((batch, n, heads), NEG_INF, dtype=q.dtype, device=q.device)
        for chunk in layout.chunks():
            if not chunk.keys.numel():
                continue
            scores, counts, _, _, vs = _chunk_scores(q, k, v, key_mask, layout, chunk, scale)
            top = scores.amax(dim=-1, keepdim=True)
            # rows with no key (kept by no pair, no active block, every key padded) output 0 with lse -inf
            weights = _weights_(scores, top.masked_fill(top == NEG_INF, 0.0), counts)
            total = weights.sum(dim=-1, keepdim=True)
            rows_lse = top + torch.log(total)
            weights.div_(total.masked_fill(total == 0, 1.0))
            rows_lse = rows_lse.masked_fill(total == 0, NEG_INF).squeeze(-1).transpose(1, 2)
            _put(out, chunk.start, chunk.end, chunk.heads, torch.matmul(weights, vs).transpose(1, 2))
            _put(lse, chunk.start, chunk.end, chunk.heads, rows_lse)
        ctx.save_for_backward(q, k, v, out, lse, key_mask)
        ctx.layout, ctx.scale = layout, scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, key_mask = ctx.saved_tensors
        acc = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        dq = torch.zeros_like(q)
        dk, dv = (torch.zeros(k.shape, dtype=acc, device=k.device) for _ in range(2))
        dout = dout.to(q.dtype)
        for chunk in ctx.layout.chunks():
            if not chunk.keys.numel():
                continue
            _accumulate(ctx, q, k, v, key_mask, chunk, (dout, out, lse), (dq, dk, dv))
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None


def _accumulate(ctx, q, k, v, key_mask, chunk, saved, grads):
    """One chunk's share of dq (its rows) and of dk, dv (its keys, summed over each kv head's query heads):
    probabilities recomputed from the saved lse; dS = P (dP - rowsum(dO o O)) as FlashAttention's backward."""
    (dout, out, lse), (dq, dk, dv) = saved, grads
    scale, rows = ctx.scale, slice(chunk.start, chunk.end)
    scores, counts, qs, ks, vs = _chunk_scores(q, k, v, key_mask, ctx.layout, chunk, scale)
    rows_lse = _heads(lse[:, rows], chunk.heads).transpose(1, 2).unsqueeze(-1)
    probs = _weights_(scores, rows_lse.masked_fill(rows_lse == NEG_INF, float("inf")), counts)  # dead rows: 0
    do = _heads(dout[:, rows], chunk.heads).transpose(1, 2)
    delta = (do * _heads(out[:, rows], chunk.heads).transpose(1, 2)).sum(dim=-1, keepdim=True)
    dvs = torch.matmul(probs.transpose(-1, -2), do)
    ds = torch.matmul(do, vs.transpose(-1, -2)).sub_(delta).mul_(probs)
    _put(dq, chunk.start, chunk.end, chunk.heads, (torch.matmul(ds, ks) * scale).transpose(1, 2))
    dks = torch.matmul(ds.transpose(-1, -2), qs).mul_(scale)
    heads, kv_heads = q.shape[2], k.shape[2]
    kv_of = (chunk.heads if chunk.heads is not None else torch.arange(heads, device=q.device)) // (heads // kv_heads)
    for grad, share in ((dk, dks), (dv, dvs)):
        share = share.to(grad.dtype).transpose(1, 2)  # (B, K, H_chunk, D)
        if chunk.heads is not None or kv_heads != heads:  # sum each kv head's query heads
            summed = torch.zeros(*share.shape[:2], kv_heads, share.shape[3], dtype=grad.dtype, device=grad.device)
            share = summed.index_add_(2, kv_of, share)
        grad.index_add_(1, chunk.keys, share)


def _rows_per_chunk(batch: int, heads: int, max_chunk_elements: int):
    """rows_per_chunk(keys, heads): how many query rows a chunk of that many keys (and heads, default all)
    may hold within the budget."""
    return lambda keys, h=heads: max(1, max_chunk_elements // max(1, batch * h * keys))


def _attend(q, k, v, layout_of, scale, key_padding_mask, compute_dtype, max_chunk_elements, cu_seqlens):
    check_qkv(q, k, v)
    if cu_seqlens is not None:  # one call per packed document, positions counted from its first token
        return attend_documents(
            lambda *x: _attend(*x[:3], layout_of, scale, x[3], compute_dtype, max_chunk_elements, None),
            q,
            k,
            v,
            key_padding_mask,
            cu_seqlens,
        )
    batch, n, heads, head_dim = q.shape
    check_key_padding_mask(key_padding_mask, batch, n, q.device)
    layout = layout_of(n, heads, _rows_per_chunk(batch, heads, max_chunk_elements))
    tau = head_dim**-0.5 if scale is None else scale
    qc, kc, vc = (x.to(compute_dtype) for x in (q, k, v))
    out, lse = _LocalAttention.apply(qc, kc, vc, key_padding_mask, layout, tau)
    return out.to(q.dtype), lse.float()


def _check_pattern(segment_lengths: Sequence[int], dilation_rates: Sequence[int], semantics: str, heads: int):
    segs, rates = [int(w) for w in segment_lengths], [int(r) for r in dilation_rates]
    if not segs or len(segs) != len(rates):
        raise ValueError(f"segment_lengths {segs} and dilation_rates {rates} must be non-empty and of equal length")
    if min(segs) < 1 or min(rates) < 1:
        raise ValueError(f"segment lengths and dilation rates must be >= 1, got {segs} and {rates}")
    if semantics not in ("longnet", "head_groups"):
        raise ValueError(f"semantics={semantics!r} is unknown: use longnet or head_groups")
    if semantics == "head_groups" and heads < len(segs):
        raise ValueError(f"head_groups semantics needs num_heads >= {len(segs)} pairs, got {heads}")
    return segs, rates


def dilated_attention_local(
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
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.dilated_attention_reference`, block-local: (out in q's dtype, lse float32), differentiable;
    cu_seqlens: packed documents, each attended on its own."""
    segs, rates = _check_pattern(segment_lengths, dilation_rates, semantics, q.shape[2] if q.dim() == 4 else 0)
    return _attend(
        q,
        k,
        v,
        lambda n, h, rows: _Dilated(n, h, segs, rates, semantics, is_causal, rows, q.device),
        scale,
        key_padding_mask,
        compute_dtype,
        max_chunk_elements,
        cu_seqlens,
    )


def block_sparse_local(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_table,
    block_size: int,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    key_padding_mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float64,
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.block_sparse_reference`, block-local. `block_table`: the bool (blocks, blocks) table, or a
    function of N giving it (with cu_seqlens each document has its own length's table)."""

    def layout(n, heads, rows):
        table = block_table(n) if callable(block_table) else block_table
        blocks = -(-n // block_size)
        if tuple(table.shape) != (blocks, blocks) or table.dtype != torch.bool:
            raise ValueError(
                f"block_table must be bool ({blocks}, {blocks}) for N={n}, block_size={block_size}; "
                f"got {table.dtype} {tuple(table.shape)}"
            )
        return _Blocks(n, table, block_size, is_causal, rows, q.device)

    return _attend(q, k, v, layout, scale, key_padding_mask, compute_dtype, max_chunk_elements, cu_seqlens)


def sliding_window_local(
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
    max_chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.sliding_window_reference`, block-local: query t attends keys t - left .. t + right."""
    if left < 0 or right < 0:
        raise ValueError(f"window left={left}, right={right}: both must be >= 0 tokens")
    return _attend(
        q,
        k,
        v,
        lambda n, h, rows: _Window(n, left, right, is_causal, rows, q.device),
        scale,
        key_padding_mask,
        compute_dtype,
        max_chunk_elements,
        cu_seqlens,
    )
