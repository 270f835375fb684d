"""torch.compile without graph breaks: a dilated attention call as one opaque custom op.

Dynamo cannot trace the engine's Python (the pattern cache's and memory pool's locks, data-dependent block
plans), and it need not: under torch.compile the single-device classes call `dattn::dilated_attention`, a
torch.library custom op whose implementation is the eager engine, whose fake implementation states the output
shapes, and whose registered backward is a second op, `dattn::dilated_attention_backward` (the engine's exact
backward with the merged out and lse). Compiled output and gradients are therefore the eager ones. Dropout in
training stays eager (its seeds are drawn per call).
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

from .backends import accumulator_dtype

_MODULES: dict[tuple, torch.nn.Module] = {}


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _class(name: str) -> type:
    """The module class the op was called for, by name: this file is imported only when compiling (registering
    custom ops at start-up would put C++ callbacks where a Ctrl-C can land), so it imports no module class."""
    module_name, qualname = name.split(":")
    return getattr(importlib.import_module(module_name), qualname)


def _module(segments, rates, semantics, cls_name, backend, scale, cache, pool, chunk):
    """An eager module with this configuration (kept: building one validates and plans nothing heavy, but often)."""
    key = (tuple(segments), tuple(rates), semantics, cls_name, backend, scale, cache, pool, chunk)
    module = _MODULES.get(key)
    if module is None:
        module = _class(cls_name)(
            list(segments),
            list(rates),
            semantics=semantics,
            scale=scale or None,
            backend=backend,
            use_pattern_cache=cache,
            enable_memory_pool=pool,
            sequence_chunk_elements=chunk or None,
        ).eval()
        _MODULES[key] = module
    return module


def _attention(q, key_pad, config):
    *module_config, causal, head_first, head_total = config
    head_range = None if head_total < 0 else (head_first, head_total)
    return _module(*module_config).attention_for(q, causal, key_pad is not None, head_range)


# the module's configuration and the call's options, as the two ops' trailing arguments
_CONFIG = (
    "int[] segments, int[] rates, str semantics, str cls_name, str backend, float scale, bool cache, bool pool, "
    "int chunk, bool causal, int head_first, int head_total"
)


@torch.library.custom_op(
    "dattn::dilated_attention",
    mutates_args=(),
    schema=f"(Tensor q, Tensor k, Tensor v, Tensor? key_pad, {_CONFIG}) -> (Tensor, Tensor)",
)
def dilated_attention_op(q, k, v, key_pad, *config):
    out, lse = _attention(q, key_pad, config).forward(q, k, v, key_pad)
    return out.contiguous(), lse.to(accumulator_dtype(q.dtype)).contiguous()


@dilated_attention_op.register_fake
def _(q, k, v, key_pad, *rest):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=accumulator_dtype(q.dtype))


@torch.library.custom_op(
    "dattn::dilated_attention_backward",
    mutates_args=(),
    schema=f"(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? key_pad, {_CONFIG}) "
    "-> (Tensor, Tensor, Tensor)",
)
def dilated_attention_backward_op(dout, q, k, v, out, lse, key_pad, *config):
    attention = _attention(q, key_pad, config)
    return tuple(g.contiguous() for g in attention.backward(dout, q, k, v, out, lse, key_pad))


@dilated_attention_backward_op.register_fake
def _(dout, q, k, v, *rest):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, key_pad, *config = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], key_pad)
    ctx.config = config


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, key_pad = ctx.saved_tensors
    grads = dilated_attention_backward_op(dout.contiguous(), q, k, v, out, lse, key_pad, *ctx.config)
    return (*grads, None) + (None,) * len(ctx.config)


dilated_attention_op.register_autograd(_backward, setup_context=_setup_context)


def compiled_attention(module, q, k, v, is_causal, key_padding_mask, head_range) -> tuple[Tensor, Tensor]:
    """`module`'s call as the custom op (its configuration passed as the op's arguments)."""
    first, total = head_range if head_range is not None else (0, -1)
    return dilated_attention_op(
        q,
        k,
        v,
        key_padding_mask,
        list(module.segment_lengths),
        list(module.dilation_rates),
        module.semantics,
        _name(type(module)),
        module.backend,
        float(module.scale or 0.0),
        module.use_pattern_cache,
        module.enable_memory_pool,
        module.sequence_chunk_elements or 0,
        bool(is_causal),
        first,
        total,
    )
