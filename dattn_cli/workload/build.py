"""The one place that turns a Problem into a module and its inputs (verify, bench and profile use it).

* build_module: the registered class with the problem's constructor keywords (dilated pattern, or the
  block pattern and executor for block-sparse entries; multihead entries also get width and heads)
* make_inputs: fresh random inputs of this rank's shard: q, k, v (batch, L, heads, head_dim) for a core,
  x three times (batch, L, width) for a multihead module (self-attention, the fused projection path)
* build_call: what a measurement runs: the module, an input maker, and a call; for --target layer a
  DilatedTransformerBlock, for --target model a LongNetLM whose fwdbwd call is a training step
  (forward, loss, backward, AdamW step)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .problem import Problem


@dataclass
class Call:
    module: nn.Module
    make_inputs: Callable[[], tuple[torch.Tensor, ...]]
    run: Callable[..., torch.Tensor | None]  # None: the call ran a whole training step itself


def module_options(p: Problem) -> dict:
    """Constructor keywords of p's implementation; segment_lengths and dilation_rates always present
    (None where a block pattern takes none)."""
    if not p.spec.block_sparse:
        options = {"segment_lengths": p.segment_lengths, "dilation_rates": p.dilation_rates, "semantics": p.semantics}
    else:
        options = {"segment_lengths": None, "dilation_rates": None, **p.block_options(), "executor": p.executor}
    if p.backend != "auto" or p.spec.backends:
        options["backend"] = p.backend
    if p.layout != "contiguous":  # only the classes that take it (Problem._check_layout)
        options["layout"] = p.layout
    if p.spec.strategy == "hybrid":
        options.update(hybrid_group_options(p))
    return options


_HYBRID_GROUPS: dict = {}  # (the job's default group, h) -> this rank's groups: made once per job


def hybrid_group_options(p: Problem) -> dict:
    """head_group and ring_group of a hybrid problem over the job's ranks (kernels hybrid_groups, collective: every
    rank builds the same problems in the same order); none in a process without torch.distributed."""
    import torch.distributed as dist

    from ..kernels.distributed.hybrid import hybrid_groups

    if not (dist.is_available() and dist.is_initialized()):
        return {}
    key = (id(dist.group.WORLD), p.hybrid_size)
    if key not in _HYBRID_GROUPS:
        _HYBRID_GROUPS[key] = (dist.group.WORLD, *hybrid_groups(None, p.hybrid_size))  # the group keeps its id
    _, head_group, ring_group = _HYBRID_GROUPS[key]
    return {"head_group": head_group, "ring_group": ring_group}


def build_module(
    p: Problem, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None, **extra
) -> nn.Module:
    """p's attention module; `extra` goes to the constructor (e.g. use_pattern_cache, process_group)."""
    options = {**module_options(p), **extra}
    if p.spec.kind == "multihead":
        if p.kv_heads is not None:
            options["num_kv_heads"] = p.kv_heads
        return p.spec.cls(p.width, p.heads, **options, device=device, dtype=dtype)
    segments, rates = options.pop("segment_lengths"), options.pop("dilation_rates")
    return p.spec.cls(segments, rates, **options)


def input_shape(p: Problem, length: int | None = None) -> tuple[int, ...]:
    length = p.seq_len if length is None else length
    if p.spec.kind == "multihead":
        return (p.batch, length, p.width)
    return (p.batch, length, p.heads, p.head_dim)


def make_inputs(
    p: Problem,
    length: int | None = None,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    requires_grad: bool | None = None,
) -> tuple[torch.Tensor, ...]:
    """Random inputs of `length` positions (this rank's shard; default all of N) in p's dtype and device."""
    dtype = dtype or getattr(torch, p.dtype)
    grad = p.mode == "fwdbwd" if requires_grad is None else requires_grad
    shape = input_shape(p, length)
    device = torch.device(p.device) if generator is None else "cpu"

    def randn(size: tuple[int, ...] = shape) -> torch.Tensor:
        x = torch.randn(size, generator=generator, dtype=dtype, device=device)
        return x.to(p.device).requires_grad_(grad)

    if p.spec.kind == "multihead":
        x = randn()
        return x, x, x
    kv_shape = (*shape[:2], p.kv_head_count, shape[3])  # GQA: k and v at the kv heads
    return randn(), randn(kv_shape), randn(kv_shape)


def build_call(p: Problem, length: int | None = None, options: dict | None = None) -> Call:
    """Module, input maker and call of one measured point (`length`: this rank's shard of N; `options`: keywords
    of every call, e.g. the key_padding_mask of a padded shard)."""
    if p.target != "attention":
        return _layer_call(p) if p.target == "layer" else _model_call(p)
    device, dtype = torch.device(p.device), getattr(torch, p.dtype)
    module = build_module(p, device=device, dtype=dtype).to(device)
    fn = torch.compile(module) if p.compiled else module
    options = options or {}

    def run(q, k, v):
        out = fn(q, k, v, is_causal=p.causal, **options)
        return out[0] if p.spec.kind == "multihead" else out  # a multihead module returns (out, weights)

    return Call(module, lambda: make_inputs(p, length), run)


def _autocast(p: Problem):
    dtype = getattr(torch, p.compute_dtype)  # the amp dtype where p.amp is set
    return torch.autocast(torch.device(p.device).type, dtype=dtype) if p.amp else contextlib.nullcontext()


def _layer_options(p: Problem) -> dict:
    options = module_options(p)
    options.pop("backend", None)
    if p.kv_heads is not None:
        options["num_kv_heads"] = p.kv_heads
    return dict(
        attention=p.impl, mlp_ratio=p.mlp_ratio, device=torch.device(p.device), dtype=getattr(torch, p.dtype), **options
    )


def _layer_call(p: Problem) -> Call:
    from ..models.longnet import DilatedTransformerBlock

    block = DilatedTransformerBlock(p.width, p.heads, **_layer_options(p))
    train = p.mode == "fwdbwd"

    def run(x):
        with _autocast(p):
            if p.checkpointing and train:
                return torch.utils.checkpoint.checkpoint(block, x, p.causal, use_reentrant=False)
            return block(x, p.causal)

    return Call(block, lambda: make_inputs(p)[:1], run)  # x, once


def _model_call(p: Problem) -> Call:
    from ..models.longnet import LongNetLM

    model = LongNetLM(p.vocab_size, p.width, p.heads, p.layers, checkpointing=p.checkpointing, **_layer_options(p))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) if p.mode == "fwdbwd" else None

    def tokens():
        return (torch.randint(0, p.vocab_size, (p.batch, p.seq_len + 1), device=p.device),)

    def run(t):
        with _autocast(p):
            loss = model.loss(t[:, :-1], t[:, 1:])
        if optimizer is None:
            return loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return None

    return Call(model, tokens, run)
