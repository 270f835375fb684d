"""dattn's attention inside Hugging Face transformers models (transformers 5.x: `pip install 'dattn[hf]'`).

Importing this module registers four names with transformers' `AttentionInterface`; a model selects one with
`attn_implementation=NAME` (a config, `from_pretrained`) or `model.set_attn_implementation(NAME)`:

* `dattn_ring`: exact dense attention, context parallel. Each rank holds one contiguous shard of the sequence
  and RingDilatedAttention, with one segment of the whole sequence and dilation 1, rotates K/V around the group.
  A model keeps its attention: logits and gradients are the single-process model's, up to rounding.
* `dattn_dilated`: dattn's single-process dilated attention (ImprovedDilatedAttention) on the whole sequence.
* `dattn_ring_dilated`: the same dilated attention, context parallel (RingDilatedAttention).
* `dattn_hybrid`: the same dilated attention, hybrid h x ring (HybridDilatedAttention: heads split by all-to-all
  inside blocks of h ranks, a ring over the blocks); h is the config's `dattn_head_parallel_size` (default 2
  where it divides the ranks and heads, else 1). Its process groups are made collectively over the whole job:
  call `setup_hybrid(model, group)` on every rank before the first step, or every rank must reach the first
  attention call together (they are then made there, once a process).

The three dilated names change the model's attention on purpose: a model trained with dense attention computes
something else with them. Their pattern comes from the config: `dattn_segment_lengths`, `dattn_dilation_rates`
and optionally `dattn_semantics` (extra config fields, saved with it). The context-parallel names talk in the
world, or in the group given to `set_process_group(model, group)` (dp x sp: the sequence-parallel group).

Context-parallel training (examples/hf_llama_context_parallel.py): every rank runs the model on
`shard_causal_lm_batch(...)` (its shard of input_ids, the global position_ids, labels shifted over the whole
sequence before sharding, and the whole batch's token count, so each rank's loss is its sum of token losses over
the global count), calls backward, then `all_reduce_gradients(model)`; `all_reduce_loss(loss)` is the global loss.

Not supported (each refused in one sentence): attention masks (padding; transformers passes none to a custom
implementation), a KV cache (generation: pass use_cache=False), attention dropout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import transformers
from torch import nn

from ..kernels import HybridDilatedAttention, ImprovedDilatedAttention, RingDilatedAttention, hybrid_groups
from ..kernels.distributed.comm import group_rank_size
from ..kernels.distributed.hybrid import head_parallel_size as default_head_parallel_size
from ..kernels.distributed.sharding import padded_length, shard_sequence

IGNORE_INDEX = -100  # transformers' label of a token that is not predicted
_GROUP = "_dattn_process_group"
_CACHE = "_dattn_attention"
_HYBRID = "_dattn_hybrid_groups"
_MADE: dict[tuple[int, int], tuple] = {}  # (id(group), h) -> (group, hybrid groups) made at a first call


def _process_group(module: nn.Module) -> tuple[object, int]:
    group = module.__dict__.get(_GROUP)
    return group, group_rank_size(group)[1]


@dataclass(frozen=True)
class Registration:
    """One attention name: `build(config, seq_len, group, scale)` makes the dattn module for one call shape;
    `distributed`: the module takes this rank's shard of a sequence of seq_len = shard x world, where
    `groups(module)` is (the group handed to build, world)."""

    name: str
    build: Callable[..., nn.Module]
    distributed: bool
    groups: Callable[[nn.Module], tuple[object, int]] = _process_group


def _pattern(config) -> dict:
    segments = getattr(config, "dattn_segment_lengths", None)
    rates = getattr(config, "dattn_dilation_rates", None)
    if segments is None or rates is None:
        raise ValueError(
            f"attn_implementation={config._attn_implementation!r} needs a dilated pattern: set the config's "
            "dattn_segment_lengths and dattn_dilation_rates, e.g. [16, 64] and [1, 2]"
        )
    return dict(
        segment_lengths=list(segments),
        dilation_rates=list(rates),
        semantics=getattr(config, "dattn_semantics", "longnet"),
    )


def _dense_ring(config, seq_len: int, group, scale: float | None) -> nn.Module:
    return RingDilatedAttention([seq_len], [1], process_group=group, scale=scale)


def _dilated(config, seq_len: int, group, scale: float | None) -> nn.Module:
    return ImprovedDilatedAttention(**_pattern(config), scale=scale)


def _ring_dilated(config, seq_len: int, group, scale: float | None) -> nn.Module:
    return RingDilatedAttention(**_pattern(config), process_group=group, scale=scale)


def _hybrid(config, seq_len: int, groups: tuple, scale: float | None) -> nn.Module:
    head_group, ring_group = groups
    return HybridDilatedAttention(**_pattern(config), head_group=head_group, ring_group=ring_group, scale=scale)


def make_hybrid_groups(group=None, head_parallel_size: int = 2) -> tuple:
    """This rank's (head_group, ring_group) of a hybrid over `group` (None: the world). Collective over the whole
    job: every rank calls it, in the same order. Where ranks sit in different groups (dp x sp: one sequence-parallel
    group a replica), every rank learns every group (an all-gather) and makes every hybrid's groups, in one order."""
    if group is None or dist.get_world_size(group) == dist.get_world_size():
        return hybrid_groups(group, head_parallel_size)
    mine = tuple(dist.get_process_group_ranks(group))
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    made = {ranks: hybrid_groups(list(ranks), head_parallel_size) for ranks in sorted(set(map(tuple, everyone)))}
    return made[mine]


def _hybrid_size(config, world: int, head_parallel_size: int | None = None) -> int:
    given = getattr(config, "dattn_head_parallel_size", None) if head_parallel_size is None else head_parallel_size
    return default_head_parallel_size(config.num_attention_heads, world, given)


def _hybrid_groups(module: nn.Module) -> tuple[tuple, int]:
    """The module's hybrid groups (setup_hybrid's, else made at this first call, once a process and group), and
    the hybrid's size."""
    groups = module.__dict__.get(_HYBRID)
    if groups is None:
        if not (dist.is_available() and dist.is_initialized()):
            return (None, None), 1
        group, world = _process_group(module)
        owner = group if group is not None else dist.group.WORLD
        key = (id(owner), _hybrid_size(module.config, world))
        if key not in _MADE or _MADE[key][0] is not owner:
            _MADE[key] = (owner, make_hybrid_groups(group, key[1]))
        groups = module.__dict__[_HYBRID] = _MADE[key][1]
    return groups, group_rank_size(groups[0])[1] * group_rank_size(groups[1])[1]


REGISTRATIONS: tuple[Registration, ...] = (
    Registration("dattn_ring", _dense_ring, distributed=True),
    Registration("dattn_dilated", _dilated, distributed=False),
    Registration("dattn_ring_dilated", _ring_dilated, distributed=True),
    Registration("dattn_hybrid", _hybrid, distributed=True, groups=_hybrid_groups),
)


# attention options of other architectures (Mistral's window, Gemma 2's softcap, gpt-oss' sinks, T5's bias) that
# these names do not apply: refused rather than ignored
UNSUPPORTED_OPTIONS = ("sliding_window", "softcap", "s_aux", "position_bias")


def _check_call(name: str, query, key, attention_mask, dropout: float, options: dict) -> None:
    given = [option for option in UNSUPPORTED_OPTIONS if options.get(option) is not None]
    if given:
        raise ValueError(
            f"{name} does not apply {', '.join(given)}: use it with models whose attention has none (e.g. Llama)"
        )
    if attention_mask is not None:
        raise ValueError(
            f"{name} takes no attention mask (got one of shape {tuple(attention_mask.shape)}): causality comes "
            "from the module's is_causal; pad nothing, or use attn_implementation='sdpa' for padded batches"
        )
    if query.shape[2] != key.shape[2]:
        raise ValueError(
            f"{name} needs as many keys as queries (got {query.shape[2]} queries, {key.shape[2]} keys: a KV "
            "cache): pass use_cache=False, and generate with attn_implementation='sdpa'"
        )
    if dropout:
        raise ValueError(f"{name} applies no attention dropout (got {dropout}): set config.attention_dropout = 0")


def attention_forward(
    registration: Registration,
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention call: query (B, H, N, D), key and value (B, H_kv, N, D) -> ((B, N, H, D), None).
    GQA needs no repeat here (dattn takes H_kv < H). The dattn module is made once per (sequence length,
    group, scale) and kept on the transformers module, outside its parameters and state dict."""
    _check_call(registration.name, query, key, attention_mask, dropout, kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    group, world = registration.groups(module) if registration.distributed else (None, 1)
    seq_len = query.shape[2] * world
    cache = module.__dict__.setdefault(_CACHE, {})
    shape = (registration.name, seq_len, world, id(group), scaling)
    if shape not in cache:
        cache[shape] = registration.build(module.config, seq_len, group, scaling)
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    return cache[shape](q, k, v, is_causal=bool(causal)), None


def register_attention(registration: Registration) -> None:
    """Register one name with transformers' AttentionInterface (a name registered again is replaced)."""

    def forward(module, query, key, value, attention_mask, **kwargs):
        return attention_forward(registration, module, query, key, value, attention_mask, **kwargs)

    forward.__name__ = f"{registration.name}_attention_forward"
    transformers.AttentionInterface.register(registration.name, forward)


def register() -> tuple[str, ...]:
    """Register every name of REGISTRATIONS (done on import; calling it again is harmless); the names."""
    for registration in REGISTRATIONS:
        register_attention(registration)
    return tuple(r.name for r in REGISTRATIONS)


NAMES = register()


def set_process_group(model: nn.Module, group) -> nn.Module:
    """The context-parallel names of `model` talk inside `group` (None: the world); the model."""
    for module in model.modules():
        module.__dict__[_GROUP] = group
        module.__dict__.pop(_CACHE, None)
        module.__dict__.pop(_HYBRID, None)
    return model


def setup_hybrid(model: nn.Module, group=None, head_parallel_size: int | None = None) -> nn.Module:
    """`dattn_hybrid` of `model` over `group` (None: the world), its process groups made now. Collective over the
    whole job: every rank calls it, in the same order. head_parallel_size: else the config's
    dattn_head_parallel_size, else 2 where it divides the group's ranks and the heads; the model."""
    set_process_group(model, group)
    h = _hybrid_size(model.config, group_rank_size(group)[1], head_parallel_size)
    groups = make_hybrid_groups(group, h) if dist.is_available() and dist.is_initialized() else (None, None)
    for module in model.modules():
        module.__dict__[_HYBRID] = groups
    return model


def shard_causal_lm_batch(
    input_ids: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    group=None,
    segment_lengths=None,
) -> dict[str, torch.Tensor]:
    """This rank's part of a causal-LM batch (B, N), as keyword arguments of model(...): its shard of input_ids
    and of the global position_ids; labels (default input_ids) shifted over the whole sequence first, so a
    shard's last token predicts the next shard's first (labels and shift_labels: transformers' loss then
    shifts nothing); num_items_in_batch, the whole batch's predicted tokens, so each rank's loss is its
    sum of token losses over the global count. segment_lengths: a dilated pattern's (shards align with it).
    N must split into equal aligned shards: no padding, since the attention takes no mask."""
    rank, world = group_rank_size(group)
    batch, seq_len = input_ids.shape
    aligned = padded_length(seq_len, world, segment_lengths)
    if aligned != seq_len:
        raise ValueError(
            f"N={seq_len} does not split into {world} equal shards aligned with segments {segment_lengths}: "
            f"pad the batch to N={aligned} (padding labels {IGNORE_INDEX}, after every real token)"
        )
    labels = input_ids if labels is None else labels
    shifted = nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    positions = torch.arange(seq_len, device=input_ids.device).expand(batch, seq_len)
    part = lambda x: shard_sequence(x, group, segment_lengths=segment_lengths)[0]
    shard_labels = part(shifted)
    return dict(
        input_ids=part(input_ids),
        position_ids=part(positions),
        labels=shard_labels,
        shift_labels=shard_labels,
        num_items_in_batch=(shifted != IGNORE_INDEX).sum(),
    )


def all_reduce_loss(loss: torch.Tensor, group=None) -> torch.Tensor:
    """The global loss from each rank's (its sum of token losses over the global count): their sum, detached."""
    total = loss.detach().clone()
    if group_rank_size(group)[1] > 1:
        dist.all_reduce(total, group=group)
    return total


def all_reduce_gradients(model: nn.Module, group=None) -> None:
    """Sum every parameter's gradient over the ranks of `group`: each rank's backward gave the
    gradient of its own loss, and the global loss is their sum. One collective per gradient dtype and device; a
    parameter without a gradient counts as zero."""
    if group_rank_size(group)[1] == 1:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    buckets: dict[tuple, list[nn.Parameter]] = {}
    for p in params:
        buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    for bucket in buckets.values():
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        dist.all_reduce(flat, group=group)
        for p, summed in zip(bucket, flat.split([p.numel() for p in bucket])):
            p.grad.copy_(summed.view_as(p))
