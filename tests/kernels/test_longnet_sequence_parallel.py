"""LongNetLM under sequence parallelism (gloo): each rank runs the model on its contiguous shard with a
distributed attention; the concatenated logits and the summed parameter gradients equal one process running
the whole sequence, in float64 (to 1e-9: only the order of float64 sums differs). This holds only because the
rotary positions of a shard start at the shard's start; the 'zero' control (every shard at position 0, the old
behaviour) must differ, so the test can fail."""

import pytest
import torch

from dattn_cli.kernels import REGISTRY
from dattn_cli.runtime.launch import run_distributed
from tests.conftest import rel_err
from tests.distributed import longnet_workers as lw

# every sequence-parallel multihead implementation (the block-sparse ones take a block pattern, not dilation)
# the model's sequence parallelism takes one process group; a hybrid needs its two (hybrid_groups) and refuses
ATTENTIONS = [
    n
    for n, s in REGISTRY.items()
    if s.kind == "multihead" and s.distributed and not s.block_sparse and s.strategy != "hybrid"
]
TOLERANCE = 1e-9


def whole_sequence(seed: int):
    """The single-process model on the whole sequence: its weights, logits and parameter gradients."""
    torch.manual_seed(0)
    model = lw.build()
    tokens, upstream = lw.inputs(seed)
    logits = model(tokens)
    (logits * upstream).sum().backward()
    return model.state_dict(), logits.detach(), {n: p.grad for n, p in model.named_parameters()}


def assert_shards_equal_whole(per_rank: list[dict], logits: torch.Tensor, grads: dict, where) -> None:
    assert rel_err(torch.cat([r["logits"] for r in per_rank], 1), logits) <= TOLERANCE, where
    for name, grad in grads.items():
        summed = sum(r["grads"][name] for r in per_rank)
        assert rel_err(summed, grad) <= TOLERANCE, (where, name)


def test_there_is_a_distributed_attention_to_test():
    assert "RingMultiheadDilatedAttention" in ATTENTIONS


@pytest.mark.slow
@pytest.mark.parametrize("offsets", ["auto", "explicit", "checkpointed"])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_shards_equal_the_whole_sequence(attention, world, offsets):
    state, logits, grads = whole_sequence(seed=world)
    per_rank = run_distributed(lw.longnet_sequence_parallel, world, attention, state, world, offsets, timeout_s=120)
    assert_shards_equal_whole(per_rank, logits, grads, (attention, world, offsets))


def test_positions_restarting_at_zero_on_every_rank_would_be_caught():
    state, logits, _ = whole_sequence(seed=5)
    per_rank = run_distributed(
        lw.longnet_sequence_parallel, 2, "RingMultiheadDilatedAttention", state, 5, "zero", timeout_s=120
    )
    length = lw.SEQ // 2
    assert rel_err(per_rank[0]["logits"], logits[:, :length]) <= TOLERANCE  # rank 0's shard does start at 0
    assert rel_err(per_rank[1]["logits"], logits[:, length:]) > 1e-3


def test_the_shard_start_is_the_rank_in_the_sequence_parallel_group():
    """4 ranks as 2 data-parallel replicas x 2-rank sequence-parallel groups of strided ranks, {0, 2} and {1, 3}:
    global rank 2 is rank 1 of its group, so its shard starts at position 24, not 48."""
    state, _, _ = whole_sequence(seed=0)
    per_rank = run_distributed(lw.longnet_dp_sp, 4, "RingMultiheadDilatedAttention", state, 2, timeout_s=120)
    for replica in (0, 1):
        _, logits, grads = whole_sequence(seed=replica)
        assert_shards_equal_whole(per_rank[replica::2], logits, grads, replica)


def test_on_one_process_the_shard_is_the_sequence_and_only_relative_positions_matter():
    """Rotary scores depend on query position minus key position: shifting every position of a sequence that is
    all on one process changes nothing (so only shards attending to other ranks' keys can expose bad offsets)."""
    torch.manual_seed(0)
    model = lw.build()
    tokens, _ = lw.inputs(0)
    assert model.shard_start(lw.SEQ) == 0
    assert rel_err(model(tokens, position_offset=1000), model(tokens)) <= TOLERANCE


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_a_bad_position_offset_is_one_clear_error(bad):
    model = lw.build()
    tokens, _ = lw.inputs(0)
    with pytest.raises(ValueError, match=r"position_offset must be a non-negative integer, got .*: pass the position"):
        model(tokens, position_offset=bad)


@pytest.mark.parametrize("offset", [10**6, 2**24 + 1])
def test_a_shard_far_into_the_sequence_keeps_its_rotary_angles_in_float32(offset):
    """fp32 angles at these positions are off by 0.02 rad and by a whole radian (2^24 + 1 is no fp32 integer);
    the rotation stays within fp32 rounding of the float64 one."""
    from dattn_cli.kernels.rotary import apply_rotary

    x = torch.randn(1, 8, 2, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert rel_err(apply_rotary(x.float(), offset), apply_rotary(x, offset)) <= 1e-6
