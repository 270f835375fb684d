"""Block-local references: the definitions of docs/semantics.md (dilated attention) and docs/block-sparse.md
(attention restricted by a block table; the token sliding window), computed a chunk of query rows at a time
over only the keys that chunk can attend.

A chunk (reference_layouts.py) is a set of query rows, every key they may attend, and the heads it computes:
each row's softmax is whole in one chunk. The dilated definition weighs exp by the pair count c_h(t, u): a
chunk is a class of rows that the same pairs keep in the same segments, against the union of those pairs'
kept keys, its scores biased by log c (the dense reference's own form). A block table or a window gives one
chunk per row range, masked where the table or window forbids. The backward is written out
(FlashAttention's recomputation: each chunk's probabilities again from the row's final lse), so memory is q,
k, v, out, lse and the gradients, O(B x N x H x D), plus one chunk's scores (`max_chunk_elements`), not
O(N^2) and not O(N x window x H). Where the caller passes the upstream gradient it will backpropagate
(verify's core checks), or a row-wise function giving it from the rows' output (verify's multihead modules on a
block table or window: every head of a row in one part), the forward pass computes the gradients as well, from
the probabilities it holds: six products per score instead of seven, no second exponential. Work per head:
each row class's rows x the union of its pairs' kept keys for the dilated pattern (at most the sum over pairs
of (N / r) x (w / r)), N x (left + right + chunk) for the window, the table's key blocks for a block table.

Written from the documents, not from kernels/pattern.py or the engine; the dense references stay the
definitions, and tests/kernels/test_reference_local.py proves these equal to them on the awkward cases.
`compute_dtype` other than float64 gives the naive same-dtype computation (half precisions accumulate out
and the gradients across chunks in float32, as one matmul would, so the chunking adds little rounding of its own).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .documents import attend_documents
from .reference import check_block_table
from .reference_layouts import ALL, Blocks, Budget, Chunk, Dilated, Rows, Window
from .validation import check_key_padding_mask, check_qkv

# scores (B x H x rows x keys) per part: 32 MiB in float64. With freed memory kept in the heap (verify's
# runtime.measure.reuse_freed_memory) a part of a block table's 8,192 keys holds 4 heads of 128 rows, not 1: a
# batch of heads per product for 2 threads, 12-25% less time than 1M elements (block tables at N = 16K on 2 cores)
DEFAULT_CHUNK_ELEMENTS = 1 << 22
NEG_INF = float("-inf")


def _kv_heads(chunk: Chunk, heads: int, kv_heads: int, device) -> torch.Tensor | None:
    """The kv head of each of the chunk's query heads (GQA/MQA: h // (H / H_kv)); None: the same heads."""
    if chunk.heads is None and kv_heads == heads:
        return None
    return (chunk.heads if chunk.heads is not None else torch.arange(heads, device=device)) // (heads // kv_heads)


class _Keys:
    """A chunk's keys and values at its query heads, gathered once for all its parts, and what the chunk's rule
    and the key padding mask forbid of them. Stored transposed, (B, H_chunk, D, K) contiguous, and the dK, dV
    shares likewise: every product of a part then reads and writes unit-stride rows of K (with (B, H, K, D) keys,
    P^T dO into a K x D share took 2.3x, P V and dS K 1.4x the time, float64 on 2 cores)."""

    def __init__(self, q, k, v, key_mask, chunk):
        self.chunk, self.n = chunk, q.shape[1]
        kv_of = _kv_heads(chunk, q.shape[2], k.shape[2], q.device)
        self.kt, self.vt = (_heads(at_rows(x, chunk.keys), kv_of).permute(0, 2, 3, 1).contiguous() for x in (k, v))
        self.mask = None if key_mask is None else at_rows(key_mask, chunk.keys).view(q.shape[0], 1, 1, -1)
        self.positions = torch.arange(self.n, device=q.device)[chunk.keys] if chunk.rule is not None else None
        self.bias = None if chunk.bias is None else chunk.bias.to(q.dtype)

    def scores(self, qs: torch.Tensor, rows: Rows, upto: int, hs: slice) -> torch.Tensor:
        """qs (B, heads hs of the chunk's, R, D, scaled) against the first `upto` keys, -inf where forbidden."""
        scores = torch.matmul(qs, self.kt[:, hs, :, :upto])
        if self.bias is not None:
            scores += self.bias[:upto]
        if self.chunk.rule is not None:
            allowed = self.chunk.rule(torch.arange(self.n, device=qs.device)[rows], self.positions[:upto])
            scores.masked_fill_(~allowed, NEG_INF)
        if self.mask is not None:
            scores.masked_fill_(self.mask[..., :upto], NEG_INF)
        return scores


def at_rows(x: torch.Tensor, positions: Rows) -> torch.Tensor:
    """x[:, positions] (a gather by index_select, faster than advanced indexing)."""
    return x[:, positions] if isinstance(positions, slice) else x.index_select(1, positions)


def _part_heads(heads: torch.Tensor | None, hs: slice) -> torch.Tensor | slice | None:
    """The query heads of a part: slice hs of the chunk's heads (None: all of them; a slice: a range)."""
    if heads is None:
        return None if hs == ALL else hs
    return heads[hs]


def _heads(x: torch.Tensor, heads: torch.Tensor | slice | None) -> torch.Tensor:
    """x (B, R, H, ...) at `heads` (None: all)."""
    if heads is None or isinstance(heads, slice):
        return x if heads is None else x[:, :, heads]
    return x.index_select(2, heads)


def _put(target: torch.Tensor, rows: Rows, heads: torch.Tensor | slice | None, value: torch.Tensor, add=False):
    """target[:, rows] (at `heads`) = value, or += value."""
    if isinstance(rows, torch.Tensor):
        if isinstance(heads, torch.Tensor):  # indexed rows and heads: through a copy of the rows
            at_rows = target.index_select(1, rows)
            _put(at_rows, ALL, heads, value, add)
            target.index_copy_(1, rows, at_rows)
            return
        view = target if heads is None else target[:, :, heads]
        view.index_add_(1, rows, value) if add else view.index_copy_(1, rows, value)
        return
    view = target[:, rows]
    if heads is None or isinstance(heads, slice):
        view = view if heads is None else view[:, :, heads]
        view.add_(value) if add else view.copy_(value)
    else:
        view.index_add_(2, heads, value) if add else view.index_copy_(2, heads, value)


def _scaled_rows(q: torch.Tensor, rows: Rows, heads, scale: float) -> torch.Tensor:
    """scale x q at the rows and heads, (B, heads, R, D) contiguous, a copy (never a view of q: scaled in place):
    the scale on q, not on the R x K scores."""
    return _heads(at_rows(q, rows), heads).transpose(1, 2).clone(memory_format=torch.contiguous_format).mul_(scale)


class _LocalAttention(torch.autograd.Function):
    """out, lse of the layout's attention on q (B, N, H, D), k, v (B, N, H_kv, D), all in the compute dtype
    (half precisions: out and the gradients summed in float32, as one matmul would)."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, layout, scale, upstream):
        batch, n, heads, _ = q.shape
        acc = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        out = torch.zeros(q.shape, dtype=acc, device=q.device)
        lse = torch.full((batch, n, heads), NEG_INF, dtype=acc, device=q.device)
        ctx.layout, ctx.scale, ctx.given = layout, scale, None
        if upstream is not None:  # the gradients too, with no recomputation
            grads = tuple(torch.zeros(x.shape, dtype=acc, device=x.device) for x in (q, k, v))
            rowwise = upstream if callable(upstream) else None
            dout = torch.empty_like(q) if rowwise else upstream.to(q.dtype)  # row-wise: filled part by part
            for chunk in layout.chunks():
                _whole_chunk(ctx, q, k, v, key_mask, chunk, (out, lse, dout, rowwise), grads)
            ctx.given = (dout, tuple(g.to(x.dtype) for g, x in zip(grads, (q, k, v))))
        else:
            for chunk in layout.chunks():
                keys = _Keys(q, k, v, key_mask, chunk)
                for rows, upto, hs in chunk.parts:
                    qs = _scaled_rows(q, rows, _part_heads(chunk.heads, hs), scale)
                    _forward_part(out, lse, keys, rows, upto, hs, qs)
        ctx.save_for_backward(q, k, v, out, lse, key_mask)
        ctx.mark_non_differentiable(lse)
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        given, ctx.given = ctx.given, None  # used once: a second backward (retain_graph) recomputes
        if given is not None and torch.equal(dout, given[0].to(dout.dtype)):
            return *given[1], None, None, None, None
        q, k, v, out, lse, key_mask = ctx.saved_tensors
        acc = out.dtype
        dq, dk, dv = (torch.zeros(x.shape, dtype=acc, device=x.device) for x in (q, k, v))
        delta = (dout.to(acc) * out).sum(dim=-1)  # rowsum(dO o O), (B, N, H)
        dout = dout.to(q.dtype)
        for chunk in ctx.layout.chunks():
            _accumulate(ctx, q, k, v, key_mask, chunk, (dout, lse, delta), (dq, dk, dv))
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def _softmax(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The probabilities of a part's scores (in place) and their rows' lse; a row with no key: 0 and -inf."""
    top = scores.amax(dim=-1, keepdim=True)
    top = top.masked_fill_(top == NEG_INF, 0.0)
    probs = scores.sub_(top).exp_()
    total = probs.sum(dim=-1, keepdim=True)
    probs.mul_(total.reciprocal().masked_fill_(total == 0, 0.0))
    return probs, top + total.log()


def _forward_part(out, lse, keys: _Keys, rows: Rows, upto: int, hs: slice, qs: torch.Tensor) -> None:
    """One part's out and lse at its rows and heads (a row's keys are all in its chunk: its softmax is whole)."""
    heads = _part_heads(keys.chunk.heads, hs)
    probs, part_lse = _softmax(keys.scores(qs, rows, upto, hs))
    part_out = torch.matmul(probs, keys.vt[:, hs, :, :upto].transpose(-1, -2))
    _put(out, rows, heads, part_out.transpose(1, 2).to(out.dtype))
    _put(lse, rows, heads, part_lse.squeeze(-1).transpose(1, 2).to(lse.dtype))


def _accumulate(ctx, q, k, v, key_mask, chunk, saved, grads):
    """One chunk's share of dq (its rows) and of dk, dv (its keys, summed over its parts, then over each kv
    head's query heads): probabilities recomputed from the saved lse; dS = P (dP - rowsum(dO o O)) as
    FlashAttention's backward."""
    (dout, lse, delta), dq = saved, grads[0]
    keys = _Keys(q, k, v, key_mask, chunk)
    shares = [torch.zeros(keys.kt.shape, dtype=dq.dtype, device=dq.device) for _ in range(2)]  # dk, dv (D x K)
    for rows, upto, hs in chunk.parts:
        heads = _part_heads(chunk.heads, hs)
        qs = _scaled_rows(q, rows, heads, ctx.scale)
        scores = keys.scores(qs, rows, upto, hs)
        rows_lse = _heads(at_rows(lse, rows), heads).transpose(1, 2).unsqueeze(-1).to(q.dtype)
        probs = scores.sub_(rows_lse.masked_fill(rows_lse == NEG_INF, float("inf"))).exp_()  # dead rows: 0
        rows_delta = _heads(at_rows(delta, rows), heads).transpose(1, 2).unsqueeze(-1).to(q.dtype)
        do = _heads(at_rows(dout, rows), heads).transpose(1, 2).contiguous()
        _part_grads(ctx.scale, keys, (rows, upto, hs), qs, probs, do, rows_delta, dq, shares)
    _add_key_shares(chunk, q, k, grads, shares)


def _whole_chunk(ctx, q, k, v, key_mask, chunk, state, grads):
    """A chunk's forward and backward in one pass under a known upstream gradient: its rows' softmax is whole
    here, so out, lse and the probabilities are the rows' own, and dS = P (dP - rowsum(dO o O)) needs no
    recomputation (six products per score, not seven)."""
    (out, lse, dout, rowwise), dq = state, grads[0]
    keys = _Keys(q, k, v, key_mask, chunk)
    shares = [torch.zeros(keys.kt.shape, dtype=dq.dtype, device=dq.device) for _ in range(2)]  # dk, dv (D x K)
    for rows, upto, hs in chunk.parts:
        heads = _part_heads(chunk.heads, hs)
        qs = _scaled_rows(q, rows, heads, ctx.scale)
        probs, part_lse = _softmax(keys.scores(qs, rows, upto, hs))
        part_out = torch.matmul(probs, keys.vt[:, hs, :, :upto].transpose(-1, -2)).to(out.dtype)
        if rowwise is not None:  # the part holds its rows' whole output, every head: their upstream gradient
            if heads is not None:
                raise RuntimeError("a row-wise upstream gradient needs every head of a row in one part")
            _put(dout, rows, None, rowwise(rows, part_out.transpose(1, 2)).to(dout.dtype))
        do = _heads(at_rows(dout, rows), heads).transpose(1, 2).contiguous()
        rows_delta = (do.to(out.dtype) * part_out).sum(dim=-1, keepdim=True).to(q.dtype)
        _put(out, rows, heads, part_out.transpose(1, 2))
        _put(lse, rows, heads, part_lse.squeeze(-1).transpose(1, 2).to(lse.dtype))
        _part_grads(ctx.scale, keys, (rows, upto, hs), qs, probs, do, rows_delta, dq, shares)
    _add_key_shares(chunk, q, k, grads, shares)


def _part_grads(scale, keys: _Keys, part, qs, probs, do, rows_delta, dq, shares) -> None:
    """A part's dq rows (added into dq) and its keys' dk, dv (added into the chunk's shares), from its
    probabilities."""
    rows, upto, hs = part
    heads = _part_heads(keys.chunk.heads, hs)
    dks, dvs = (share[:, hs, :, :upto] for share in shares)  # (B, heads, D, keys)
    _add_product(dvs, do.transpose(-1, -2), probs)
    ds = torch.matmul(do, keys.vt[:, hs, :, :upto]).sub_(rows_delta).mul_(probs)
    dq_part = torch.matmul(ds, keys.kt[:, hs, :, :upto].transpose(-1, -2)).mul_(scale).transpose(1, 2)
    _put(dq, rows, heads, dq_part.to(dq.dtype), add=True)
    _add_product(dks, qs.transpose(-1, -2), ds)  # qs holds the scale


def _add_product(target: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """target += a @ b over (B, heads, ...), in place where (B, heads) flatten to one batch (no temporary
    D x K product and no second pass over it: about a fifth of such a product's time)."""
    try:
        flat = target.view(-1, *target.shape[2:])
    except RuntimeError:  # strides that do not flatten (B > 1 and a head slice)
        target += torch.matmul(a, b).to(target.dtype)
        return
    if a.dtype != target.dtype:  # half precisions: the shares are float32
        flat += torch.matmul(a, b).to(target.dtype).reshape(flat.shape)
        return
    flat.baddbmm_(a.reshape(-1, *a.shape[2:]), b.reshape(-1, *b.shape[2:]))


def _add_key_shares(chunk: Chunk, q, k, grads, shares) -> None:
    """A chunk's dk, dv shares (B, H_chunk, D, K) into dk, dv at its keys, each kv head's query heads summed."""
    kv_of = _kv_heads(chunk, q.shape[2], k.shape[2], q.device)
    for grad, share in zip(grads[1:], shares):
        share = share.permute(0, 3, 1, 2)  # (B, K, H_chunk, D)
        if isinstance(chunk.keys, slice):
            _put(grad, chunk.keys, kv_of, share, add=True)
            continue
        if kv_of is not None:  # sum each kv head's query heads
            summed = torch.zeros(*share.shape[:2], k.shape[2], share.shape[3], dtype=grad.dtype, device=grad.device)
            share = summed.index_add_(2, kv_of, share)
        grad.index_add_(1, chunk.keys, share.contiguous())  # from strided rows: 1.6x the time of copy and add


def _attend(q, k, v, layout_of, scale, key_padding_mask, compute_dtype, max_chunk_elements, cu_seqlens, upstream):
    check_qkv(q, k, v)
    if cu_seqlens is not None:  # one call per packed document, positions counted from its first token
        return attend_documents(
            lambda *x: _attend(*x[:3], layout_of, scale, x[3], compute_dtype, max_chunk_elements, None, None),
            q,
            k,
            v,
            key_padding_mask,
            cu_seqlens,
        )
    batch, n, heads, head_dim = q.shape
    check_key_padding_mask(key_padding_mask, batch, n, q.device)
    layout = layout_of(n, heads, Budget(batch, heads, max_chunk_elements, whole_heads=callable(upstream)))
    tau = head_dim**-0.5 if scale is None else scale
    qc, kc, vc = (x.to(compute_dtype).contiguous() for x in (q, k, v))  # a fused projection's views: gathers 3x slower
    given = upstream.to(compute_dtype) if isinstance(upstream, torch.Tensor) else upstream
    out, lse = _LocalAttention.apply(qc, kc, vc, key_padding_mask, layout, tau, given)
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
    upstream: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.dilated_attention_reference`, block-local: (out in q's dtype, lse float32), differentiable;
    cu_seqlens: packed documents, each attended on its own. upstream: the gradient of out the caller will
    backpropagate, where known (then the gradients are computed in the forward pass, without recomputation; a
    backward with any other gradient recomputes); block_sparse_local and sliding_window_local also take a
    row-wise function of the output, (rows, out (B, R, H, D)) -> its gradient, each part holding every head."""
    segs, rates = _check_pattern(segment_lengths, dilation_rates, semantics, q.shape[2] if q.dim() == 4 else 0)
    layout = lambda n, h, rows: Dilated(n, h, segs, rates, semantics, is_causal, rows, q.device)
    return _attend(q, k, v, layout, scale, key_padding_mask, compute_dtype, max_chunk_elements, cu_seqlens, upstream)


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
    upstream: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.block_sparse_reference`, block-local. `block_table`: the bool (blocks, blocks) table, or a
    function of N giving it (with cu_seqlens each document has its own length's table)."""

    def layout(n, heads, rows):
        table = check_block_table(block_table(n) if callable(block_table) else block_table, n, block_size)
        return Blocks(n, table, block_size, is_causal, rows, q.device)

    return _attend(q, k, v, layout, scale, key_padding_mask, compute_dtype, max_chunk_elements, cu_seqlens, upstream)


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
    upstream: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.sliding_window_reference`, block-local: query t attends keys t - left .. t + right."""
    if left < 0 or right < 0:
        raise ValueError(f"window left={left}, right={right}: both must be >= 0 tokens")
    layout = lambda n, h, rows: Window(n, left, right, is_causal, rows)
    return _attend(q, k, v, layout, scale, key_padding_mask, compute_dtype, max_chunk_elements, cu_seqlens, upstream)
