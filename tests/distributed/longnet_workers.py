"""Rank functions for LongNetLM under sequence parallelism (module level, so rank processes can import them).

Every rank loads the same float64 weights, takes its contiguous shard of the same tokens and of a fixed
upstream gradient, and returns its logits and parameter gradients: the test concatenates the logits and sums
the gradients, which must equal one process running the whole sequence.
"""

import torch
import torch.distributed as dist

from dattn_cli.models import LongNetLM

VOCAB, WIDTH, HEADS, LAYERS, BATCH, SEQ = 13, 48, 6, 2, 2, 48  # head dim 8; H=6 splits over 2 and 3 ranks
SEGMENTS, DILATIONS = [8, 48], [1, 2]  # 8 fits in every shard; 48 spans every rank's shard (L = 24, 16, 12)


def build(attention: str = "ImprovedMultiheadDilatedAttention", **options) -> LongNetLM:
    return LongNetLM(
        VOCAB,
        WIDTH,
        HEADS,
        LAYERS,
        segment_lengths=SEGMENTS,
        dilation_rates=DILATIONS,
        attention=attention,
        dtype=torch.float64,
        **options,
    )


def inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (BATCH, SEQ) and the upstream gradient of the logits (BATCH, SEQ, VOCAB)."""
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
        torch.randn(BATCH, SEQ, VOCAB, generator=g, dtype=torch.float64),
    )


def run_shard(model: LongNetLM, tokens, upstream, rank: int, world: int, offsets: str):
    """This rank's logits and named parameter gradients for its shard. offsets: 'auto' (the model infers the
    shard start), 'checkpointed' (the same with per-block checkpointing), 'explicit' (position_offset=rank*L)
    or 'zero' (every shard at 0: the bug this guards against)."""
    length = tokens.shape[1] // world
    shard = slice(rank * length, (rank + 1) * length)
    model.checkpointing = offsets == "checkpointed"
    offset = {"auto": None, "checkpointed": None, "explicit": rank * length, "zero": 0}[offsets]
    logits = model(tokens[:, shard], position_offset=offset)
    (logits * upstream[:, shard]).sum().backward()
    return {"logits": logits.detach(), "grads": {n: p.grad for n, p in model.named_parameters()}}


def longnet_sequence_parallel(rank: int, world: int, attention: str, state: dict, seed: int, offsets: str):
    """The whole world is one sequence-parallel group (process_group=None: the default group)."""
    model = build(attention)
    model.load_state_dict(state)
    tokens, upstream = inputs(seed)
    return run_shard(model, tokens, upstream, rank, world, offsets)


def longnet_dp_sp(rank: int, world: int, attention: str, state: dict, sp: int):
    """world / sp data-parallel replicas, each a sequence-parallel group of sp strided ranks (replica d: ranks
    d, d + dp, d + 2dp, ...) passed as process_group; replica d runs the batch of seed d. A shard's start comes
    from its rank in its group: from the global rank, the gaps between a group's shards would be dp times too
    long, and the relative positions across shards wrong."""
    dp = world // sp
    groups = [dist.new_group(list(range(first, world, dp))) for first in range(dp)]  # every rank, every group
    member, replica = divmod(rank, dp)
    model = build(attention, process_group=groups[replica])
    model.load_state_dict(state)
    tokens, upstream = inputs(replica)
    return run_shard(model, tokens, upstream, member, sp, "auto")
