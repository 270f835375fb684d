"""What every check is compared with, computed once and shared.

Inputs are a function of (case, seed): `case_seed` seeds the generator that draws them (and a multihead
module's weights), so every implementation checked on a case sees the same inputs, in one process or on
every rank. They are drawn in float32 (float64 for a float64 check) and rounded to the checked dtype once,
and the reference is computed from exactly those values in float64: an error is the implementation's
computation, not its inputs' rounding (flash-attn's tests do the same).

The reference of a check, out, lse and the gradients in float64, and the error of the naive same-dtype
computation against it, depend on (case, seed, semantics, causal, block pattern, dtype, device) and, for a
multihead module, its forward, settings and weights: `reference_key`. `ReferenceCache` computes each once and keeps
it while later checks use it (verify runs the checks of one key together).

Which definition: the dense references of kernels/reference.py for N <= LOCAL_REFERENCE_ABOVE, the
block-local ones of kernels/reference_local.py above (the same function, tested equal; memory
O(N x H x D) plus a chunk instead of B x H x N^2 saved scores). Both follow the Problem's pattern, not the
module under test. A block-local computation, the reference and the naive one alike, is given the upstream
gradient its output will get where that is known beforehand (a core's; a multihead module's through its output
projection and sub-LayerNorm, output_gradient) and computes the gradients in its forward pass from the
probabilities it holds, as autograd does from the dense reference's: no recomputation.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels import reference as dense, reference_local as local
from ..kernels.documents import attend_documents
from ..workload.build import input_shape
from ..workload.check_memory import CACHE_BYTES  # references kept beyond the one in use
from ..workload.problem import Problem
from .compare import DTYPES, naive_errors
from .outputs import core_outputs, document_options, multihead_outputs
from .weights import seeded_multihead

LOCAL_REFERENCE_ABOVE = 1024  # tokens: longer sequences are checked against the block-local references (at
# N = 1024 the block-local one took a tenth of the dense one's time; the case matrix, N <= 1000, keeps the definitions)
CHUNK_ELEMENTS = {"cpu": local.DEFAULT_CHUNK_ELEMENTS, "cuda": 1 << 26}  # scores per chunk of the local references


def case_seed(case: str, seed: int) -> int:
    """The seed of every draw of `case` under the run's `seed`: the same for every implementation checked."""
    return int.from_bytes(hashlib.sha256(f"{seed}\0{case}".encode()).digest()[:7], "big")


def uses_local_reference(p: Problem) -> bool:
    return p.seq_len > LOCAL_REFERENCE_ABOVE


def reference_scores(case) -> int:
    """Scores the float64 reference of a check of `case` (a cases.Case) computes: B x H x N^2 dense; block-local
    (N above LOCAL_REFERENCE_ABOVE), about B x H x N x the widest segment."""
    p = case.problem
    keys = min(p.seq_len, max(p.segment_lengths)) if uses_local_reference(p) else p.seq_len
    return p.batch * p.heads * p.seq_len * keys


def chunk_elements(device: str) -> int:
    return CHUNK_ELEMENTS["cuda" if device.startswith("cuda") else "cpu"]


def reference_key(case: str, p: Problem, seed: int) -> tuple:
    """What a check's reference depends on beyond the run's seed: a multihead module's by its forward, its
    settings and its weights (the registered multihead classes share one forward, and the same weights from
    one seed, so they share a reference)."""
    pattern = None
    if p.spec.block_sparse:
        pattern = tuple(sorted(p.block_options().items(), key=lambda kv: kv[0]))
        pattern = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in pattern)
    kind = _module_fingerprint(case, p.model_dump_json(), seed) if p.spec.kind == "multihead" else "core"
    return (case, kind, p.semantics, p.causal, pattern, p.dtype, p.device)


@functools.lru_cache(maxsize=64)
def _module_fingerprint(case: str, problem: str, seed: int) -> tuple:
    p = Problem.model_validate_json(problem)
    module = multihead_module(p, case_seed(case, seed))
    settings = tuple(
        sorted((k, v) for k, v in vars(module).items() if isinstance(v, (int, float, bool, str)) and k != "training")
    )
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return (type(module).forward.__qualname__, type(module).forward.__module__, settings, digest.hexdigest())


def draw_inputs(p: Problem, seed: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The inputs of the whole sequence (q, k, v of a core; x of a multihead module) and the upstream gradient,
    drawn from `seed` in float32 (float64 for a float64 check) and rounded to p's dtype, on p's device: copies
    of the last draw, which the reference, the naive computation and each implementation of a case share (a
    draw of 4 x N x H x D float64 normals took 1.4 s at N = 16K, float32 ones 0.26 s; every rank draws)."""
    shape = input_shape(p)
    kv_shape = (*shape[:2], p.kv_head_count, shape[3]) if p.spec.kind != "multihead" else None
    shapes = (shape,) if kv_shape is None else (shape, kv_shape, kv_shape)
    drawn = [x.clone() for x in _draw(seed, (*shapes, shape), p.dtype, p.device)]
    return drawn[:-1], drawn[-1]


@functools.lru_cache(maxsize=1)
def _draw(seed: int, shapes: tuple, dtype: str, device: str) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    drawn = torch.float64 if dtype == "float64" else torch.float32
    return tuple(torch.randn(s, generator=gen, dtype=drawn).to(device, DTYPES[dtype]) for s in shapes)


def attention_of(p: Problem, compute_dtype: torch.dtype) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The reference attention of p's pattern: call(q, k, v, is_causal, key_padding_mask=, cu_seqlens=,
    upstream=) -> (out, lse), differentiable, computed in `compute_dtype` (upstream: the gradient of out that
    will be backpropagated, where known)."""
    is_local = uses_local_reference(p)
    options = {"compute_dtype": compute_dtype}
    if is_local:
        options["max_chunk_elements"] = chunk_elements(p.device)
    if not p.spec.block_sparse:
        fn = local.dilated_attention_local if is_local else dense.dilated_attention_reference
        args = (p.segment_lengths, p.dilation_rates)
        extra = {"semantics": p.semantics}
    elif p.pattern == "sliding_window":
        fn = local.sliding_window_local if is_local else dense.sliding_window_reference
        args, extra = p.block_pattern().token_window, {}
    else:
        pattern, heads = p.block_pattern(), p.heads
        fn = local.block_sparse_local if is_local else dense.block_sparse_reference
        args, extra = (lambda n: pattern.table(n, heads), p.block_size), {}

    def one_document(q, k, v, is_causal, key_padding_mask, **given):
        table_args = (args[0](q.shape[1]), args[1]) if callable(args[0]) else args
        return fn(q, k, v, *table_args, is_causal, key_padding_mask=key_padding_mask, **extra, **options, **given)

    def call(q, k, v, is_causal=False, key_padding_mask=None, cu_seqlens=None, upstream=None):
        if cu_seqlens is None:  # the upstream gradient, where known, spares a local reference's recomputation; a
            # row-wise one needs every head of a row in one part: block tables and windows, not the dilated layout
            usable = upstream is not None and (p.spec.block_sparse or not callable(upstream))
            given = {"upstream": upstream} if is_local and usable else {}
            return one_document(q, k, v, is_causal, key_padding_mask, **given)
        return attend_documents(lambda *x: one_document(*x[:3], is_causal, x[3]), q, k, v, key_padding_mask, cu_seqlens)

    return call


class PatternReference(torch.nn.Module):
    """Stands in for a multihead module's core: the reference attention, differentiable; `upstream`: the gradient
    its output will get, where known (output_gradient)."""

    def __init__(self, attention: Callable[..., tuple[torch.Tensor, torch.Tensor]], upstream=None):
        super().__init__()
        self.attention, self.upstream = attention, upstream

    def forward(self, q, k, v, is_causal=False, key_padding_mask=None, **documents):
        given = {"upstream": self.upstream} if self.upstream is not None else {}
        return self.attention(q, k, v, is_causal, key_padding_mask=key_padding_mask, **documents, **given)[0]


def output_gradient(module: torch.nn.Module, upstream: torch.Tensor):
    """The gradient that a MultiheadDilatedAttention's core output gets under `upstream`: (B, N, H, D) where the
    module has no sub-LayerNorm; else a row-wise function of that output, rows, out (B, R, H, D) -> (B, R, H, D):
    the output projection's gradient is a constant and the LayerNorm's backward is each row's own (bitwise the same
    by row blocks as whole, so autograd later hands the reference the very gradient it used). None for a module
    with another forward."""
    from ..kernels.multihead import MultiheadDilatedAttention

    if type(module).forward is not MultiheadDilatedAttention.forward:
        return None
    shape = (*upstream.shape[:-1], module.num_heads, module.head_dim)
    with torch.enable_grad():  # the output projection's input gradient, as the module's own backward computes it
        z = torch.zeros(upstream.shape, dtype=module.out_proj.weight.dtype, requires_grad=True)
        g = torch.autograd.grad(module.out_proj(z), z, upstream.to(z.dtype))[0]
    if module.norm is None:
        return g.view(shape)

    def rows_gradient(rows, out: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            o = out.detach().flatten(2).requires_grad_()
            return torch.autograd.grad(module.norm(o), o, local.at_rows(g, rows))[0].view(out.shape)

    return rows_gradient


def reference_outputs(p: Problem, seed: int, compute_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """What an implementation of p outputs, by the reference computed in `compute_dtype` from the inputs of
    `seed` (in p's dtype, upcast): out, lse and the gradients (multihead: out, dx, dparams)."""
    inputs, upstream = draw_inputs(p, seed)
    attention, documents = attention_of(p, compute_dtype), document_options(p)
    if p.spec.kind == "multihead":
        module = copy.deepcopy(multihead_module(p, seed)).to(compute_dtype)
        module.attention = PatternReference(attention, output_gradient(module, upstream))  # `call` decides its use
        return multihead_outputs(module, inputs[0].to(compute_dtype), upstream, p.causal, **documents)
    xs = [x.to(compute_dtype).requires_grad_() for x in inputs]
    return core_outputs(lambda q, k, v: attention(q, k, v, p.causal, upstream=upstream, **documents), xs, upstream)


def multihead_module(p: Problem, seed: int) -> torch.nn.Module:
    """The multihead module checked for p: weights from `seed`, built in float64 and rounded to p's dtype."""
    return seeded_multihead(p, seed, torch.float64).to(device=p.device, dtype=DTYPES[p.dtype])


@dataclass
class Reference:
    outputs: dict[str, torch.Tensor]  # float64
    naive: dict[str, float]  # relative error of the naive same-dtype computation, per quantity

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.outputs.values())


class ReferenceCache:
    """References by key, each computed once; kept while they fit in CACHE_BYTES, and always the last one."""

    def __init__(self, seed: int):
        self.seed = seed
        self.entries: OrderedDict[tuple, Reference] = OrderedDict()
        self.computed = 0  # how many references were computed (tests: shared, not recomputed)

    def get(self, case: str, p: Problem) -> Reference:
        key = reference_key(case, p, self.seed)
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        if sum(e.nbytes for e in self.entries.values()) > CACHE_BYTES:  # one large reference: drop it first
            self.entries.clear()
        seed = case_seed(case, self.seed)
        outputs = reference_outputs(p, seed, torch.float64)
        dtype = DTYPES[p.dtype]
        naive = (
            naive_errors(reference_outputs(p, seed, dtype), outputs)
            if dtype != torch.float64
            else {k: 0.0 for k in outputs}  # the naive float64 computation is the reference itself
        )
        entry = self.entries[key] = Reference(outputs, naive)
        self.computed += 1
        while sum(e.nbytes for e in self.entries.values()) > CACHE_BYTES and len(self.entries) > 1:
            self.entries.popitem(last=False)
        return entry
