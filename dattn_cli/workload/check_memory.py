"""Memory of one verify check, by parts: the float64 reference (dense or block-local), the naive same-dtype
computation and the implementation, as they are alive together (verify/references.py, verify/single.py,
verify/distributed.py). verify refuses a run whose largest check does not fit; the planner's model of the
reference baseline (plan/memory.py) is `reference_items`.

X is one (B, N, H, D) tensor (a multihead module's (B, N, E), E = H x D); K/V have H_kv heads.

* inputs           the case's q, k, v and upstream gradient in the checked dtype (multihead: x and upstream),
                   twice: the draw kept for the case's next computation and the copy in use
* reference        one differentiable call in its compute dtype: the float64 leaves (q, k, v), out and lse,
                   dq, dk, dv, and what the call itself keeps: dense, the scores and probabilities of every
                   chunk (autograd saves both: 2 x B x H x N^2 elements); block-local, one chunk's working set
                   (LOCAL_CHUNK_TENSORS score-sized tensors of max_chunk_elements; its keys' K, V, dK and dV at
                   the query heads) and the float32 out and gradient accumulators of a half computation. A
                   multihead module adds its projections' activations.
* kept reference   the float64 out, lse and gradients the check is compared with (references.ReferenceCache
                   keeps earlier ones within CACHE_BYTES)
* implementation   the caller's figure (verify passes the planner's), else IMPL_TENSORS x X in the dtype
* comparison       a few float64 slices (verify/compare.STEP elements)

The phases: the reference (inputs + reference), the naive computation beside the kept reference, and the
implementation beside the kept reference; the peak is the largest.
"""

from __future__ import annotations

from .problem import ELEMENT_BYTES, Problem

DENSE_SAVED = 2  # score-sized tensors per element of B x H x N^2 that autograd saves in the dense reference
DENSE_CHUNK_ELEMENTS = 1 << 22  # the dense reference's chunk of scores (kernels/reference.py)
LOCAL_CHUNK_TENSORS = 6  # scores, weights, dP, a mask and temporaries of one block-local chunk
MULTIHEAD_ACTIVATIONS = 6  # x-sized tensors a multihead module keeps for backward (projections, attention out)
IMPL_TENSORS = 14  # an implementation without a model: inputs, out, grads and its working copies, in X
COMPARE_BYTES = 4 * (1 << 22) * 8  # verify/compare: float64 slices of got and ref, their difference, a mask
CACHE_BYTES = 256 * 2**20  # verify/references.CACHE_BYTES: earlier references kept


def x_elements(p: Problem) -> int:
    return p.batch * p.seq_len * p.heads * p.head_dim


def kv_elements(p: Problem) -> int:
    return 0 if p.spec.kind == "multihead" else p.batch * p.seq_len * p.kv_head_count * p.head_dim


def input_bytes(p: Problem) -> int:
    """The case's inputs and upstream gradient in p's dtype."""
    return (2 * x_elements(p) + 2 * kv_elements(p)) * ELEMENT_BYTES[p.dtype]


def output_elements(p: Problem) -> int:
    """out, lse and the gradients of one check (multihead: out, dx and the parameters' gradients)."""
    x, kv = x_elements(p), kv_elements(p)
    if p.spec.kind == "multihead":
        width = p.heads * p.head_dim
        return 2 * x + 4 * width * (width + 1)
    return 2 * x + 2 * kv + p.batch * p.seq_len * p.heads


def reference_items(p: Problem, local: bool, chunk_elements: int, compute: str = "float64") -> dict[str, int]:
    """Bytes of one reference call of p in `compute` (forward, and backward when p.mode is fwdbwd)."""
    e = ELEMENT_BYTES[compute]
    x, kv = x_elements(p), kv_elements(p)
    fwdbwd = p.mode == "fwdbwd"
    scores = p.batch * p.heads * p.seq_len**2
    items = {
        f"{compute} inputs": (x + 2 * kv if kv else x) * e,
        "out, lse": (x + p.batch * p.seq_len * p.heads) * e,
    }
    if fwdbwd:
        items["gradients"] = (x + 2 * kv if kv else x) * e
        if compute != p.dtype:
            items["upstream gradient"] = x * e  # cast to the compute dtype
    if p.spec.kind == "multihead":
        items["projections"] = MULTIHEAD_ACTIVATIONS * x * e
    if local:
        items["one chunk"] = LOCAL_CHUNK_TENSORS * chunk_elements * e
        # a table row: any; a dilated row class: the union of its pairs' kept keys
        pairs = zip(p.segment_lengths, p.dilation_rates)
        keys = p.seq_len if p.spec.block_sparse else min(p.seq_len, sum(-(-min(w, p.seq_len) // r) for w, r in pairs))
        items["one chunk's K, V, dK, dV"] = 4 * p.batch * keys * p.heads * p.head_dim * e
        rows = p.batch * p.seq_len * p.heads  # lse, and rowsum(dO o O) of the backward
        if fwdbwd:
            items["rowsum(dO o O)"] = rows * e
            if p.spec.kind == "multihead":  # the core output's gradient, given part by part (references.py)
                items["core output gradient"] = x * e
        if e < 4:  # out, lse and the gradients are summed across chunks in float32
            items["float32 accumulators"] = (x + rows + (x + 2 * (kv or x) + rows if fwdbwd else 0)) * 4
    elif fwdbwd:
        items["saved scores"] = DENSE_SAVED * scores * e
    else:
        items["one chunk"] = 3 * min(scores, DENSE_CHUNK_ELEMENTS) * e
    if not local and p.kv_heads is not None and p.kv_heads != p.heads:
        items["K/V repeated to H heads"] = 2 * x * e
    return items


def check_items(
    p: Problem, local: bool, chunk_elements: int, impl_bytes: int | None = None
) -> tuple[dict[str, int], int]:
    """(the parts, the peak) of one single-process check of p on one device, the reference not yet computed."""
    inputs = 2 * input_bytes(p)  # the kept draw and the copy in use
    reference = sum(reference_items(p, local, chunk_elements).values())
    kept = output_elements(p) * 8 + CACHE_BYTES
    naive = sum(reference_items(p, local, chunk_elements, p.dtype).values()) if p.dtype != "float64" else 0
    impl = IMPL_TENSORS * x_elements(p) * ELEMENT_BYTES[p.dtype] if impl_bytes is None else impl_bytes
    items = {
        "inputs": inputs,
        "float64 reference": reference,
        "kept reference": kept,
        "naive computation": naive,
        "implementation": impl,
        "comparison": COMPARE_BYTES,
    }
    peak = inputs + max(reference + CACHE_BYTES, kept + naive, kept + impl + COMPARE_BYTES)
    return items, peak


def group_peak(p: Problem, world: int, checks: int, local: bool, chunk_elements: int, rank_bytes: int | None) -> int:
    """Peak of a process group of `world` ranks running `checks` checks of p on this machine (CPU: every rank
    here), then their comparison in this process: each rank draws the whole inputs and runs its shard; this
    process then holds every check's joined outputs beside the reference."""
    x = x_elements(p) * ELEMENT_BYTES[p.dtype]
    rank = 2 * input_bytes(p) + (IMPL_TENSORS * x // world if rank_bytes is None else rank_bytes)
    ranks = (world if p.device == "cpu" else 1) * rank + CACHE_BYTES
    held = 2 * checks * output_elements(p) * ELEMENT_BYTES[p.dtype]  # the ranks' shards and their join
    _, single = check_items(p, local, chunk_elements, impl_bytes=0)
    return max(ranks, held + single)
