"""Ring and all-gather dilated attention on gloo: shards equal the single-process reference, and the bytes
each rank moves equal the closed-form volume of docs/communication.md."""

import pytest
import torch

from dattn_cli.kernels import dilated_attention_reference
from dattn_cli.kernels.distributed.sequence_parallel import comm_volume, shard_plan
from dattn_cli.runtime.launch import DistributedError, run_distributed
from tests.conftest import rel_err
from tests.distributed import workers

IMPLS = ["RingDilatedAttention", "DistributedImprovedDilatedAttention"]
STRATEGY = {"RingDilatedAttention": "ring", "DistributedImprovedDilatedAttention": "allgather"}


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("impl", IMPLS)
def test_shards_equal_the_reference_and_bytes_equal_the_formula(impl, world):
    per_rank = run_distributed(workers.sequence_parallel_cases, world, impl, timeout_s=120)
    assert per_rank[0], "no case is shardable at this world size"
    for (c, i), _ in per_rank[0].items():
        N, H, segs, rates = workers.SP_CASES[c]
        sem, causal, masked = workers.SP_VARIANTS[i]
        q, k, v, up, mask = workers.sp_inputs(c, i)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        ref, ref_lse = dilated_attention_reference(q, k, v, segs, rates, causal, sem, key_padding_mask=mask)
        ref_grads = torch.autograd.grad(ref, (q, k, v), up)
        where = (impl, world, c, sem, causal, masked)
        assert rel_err(torch.cat([r[c, i]["out"] for r in per_rank], 1), ref) <= 1e-5, where
        assert rel_err(torch.cat([r[c, i]["lse"] for r in per_rank], 1), ref_lse) <= 1e-5, where
        for j in range(3):
            assert rel_err(torch.cat([r[c, i]["grads"][j] for r in per_rank], 1), ref_grads[j]) <= 1e-4, (where, j)
        expected = comm_volume(STRATEGY[impl], N, world, 2, H, 8, 4, segs, rates, sem, causal, masked)
        for rank, r in enumerate(per_rank):
            comm = {key: value for key, value in r[c, i]["comm"].items() if key != "forward_calls"}
            assert comm == (expected[rank] if world > 1 else dict.fromkeys(comm, 0)), (where, rank)


def test_every_shard_covered_means_zero_bytes():
    # N=64, p=2..4: segments 8 and 16 divide every shard
    for world in (2, 4):
        for strategy in ("ring", "allgather"):
            for rank_counts in comm_volume(strategy, 64, world, 2, 4, 8, 4, [8, 16], [1, 2]):
                assert set(rank_counts.values()) == {0}


def test_ring_volume_by_hand():
    # N=48, p=4 (L=12), pair (48, 2) spans all 4 ranks; longnet, H=4: head sets {0,2} (offset 0) and {1,3}
    # (offset 1), each 6 kept rows per rank -> K+V buffer = 2 * B(2) * 4 heads * 6 rows * D(8) * 4 bytes
    buffer = 2 * 2 * 4 * 6 * 8 * 4
    counts = comm_volume("ring", 48, 4, 2, 4, 8, 4, [12, 48], [1, 2])
    for rank in range(4):  # non-causal: 3 buffers each way; backward: again, plus 3 dK/dV shares home
        assert counts[rank] == dict(
            forward_bytes_sent=3 * buffer,
            forward_bytes_received=3 * buffer,
            backward_bytes_sent=6 * buffer,
            backward_bytes_received=6 * buffer,
        )
    causal = comm_volume("ring", 48, 4, 2, 4, 8, 4, [12, 48], [1, 2], is_causal=True)
    # member a receives the a earlier buffers; sends its own plus the ones a later rank still needs
    assert [c["forward_bytes_received"] for c in causal] == [0, buffer, 2 * buffer, 3 * buffer]
    assert [c["forward_bytes_sent"] for c in causal] == [buffer, 2 * buffer, 3 * buffer, 0]
    assert [c["backward_bytes_received"] - c["forward_bytes_received"] for c in causal] == [
        3 * buffer,
        2 * buffer,
        buffer,
        0,
    ]
    unsparsified = 2 * 2 * 12 * 4 * 8 * 4  # the full K/V shard: r = 2 times larger than what moves
    assert buffer * 2 == unsparsified


def test_allgather_volume_by_hand():
    # N=96, p=4 (L=24), longnet H=5: pair (48, 2) spans 2 ranks, pair (96, 5) spans 4
    def buffer(rate, heads_per_set_rows):
        return 2 * 2 * sum(heads_per_set_rows) * 8 * 4

    # rate 2: offsets 0 (heads 0,2,4) and 1 (heads 1,3), 12 rows each; rate 5: 5 single-head sets with
    # ceil((24 - u0) / 5) rows, u0 = (o - 24 * rank) mod 5 running over 0..4 on every rank: 5+5+5+5+4
    pair_48 = buffer(2, [3 * 12, 2 * 12])
    pair_96 = buffer(5, [5, 5, 5, 5, 4])
    counts = comm_volume("allgather", 96, 4, 2, 5, 8, 4, [8, 48, 96], [1, 2, 5])
    for c in counts:
        assert c["forward_bytes_sent"] == c["forward_bytes_received"] == 1 * pair_48 + 3 * pair_96


def test_unaligned_segments_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="segment length 16 .* shard length 24 = N/p = 48/2: use segment lengths"):
        shard_plan(48, 2, 0, 4, [16], [1], "longnet", "RingDilatedAttention")


def test_ranks_with_different_configs_fail_up_front():
    with pytest.raises(DistributedError, match="ranks disagree"):
        run_distributed(workers.ring_with_rank_specific_segments, 2, timeout_s=30)


def test_ring_multihead_on_an_explicit_group_counts_bytes():
    stats = run_distributed(workers.ring_multihead_under_group, 2, timeout_s=60)
    expected = comm_volume("ring", 32, 2, 1, 2, 8, 4, [8, 32], [1, 2])
    for rank, s in enumerate(stats):
        assert {k: v for k, v in s.items() if k != "forward_calls"} == expected[rank]


def test_ring_posts_the_next_transfer_before_computing_the_current_block():
    per_rank = run_distributed(workers.ring_event_order, 3, timeout_s=60)
    for rank, events in enumerate(per_rank):
        # step 1's transfer, then step 2's posted before step 1's block is computed, then step 2's block
        assert events == ["post", "post", f"compute {(rank - 1) % 3}", f"compute {(rank - 2) % 3}"], events


def test_two_runs_at_once_pick_different_ports():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(run_distributed, workers.small_ring, 2, timeout_s=60) for _ in range(2)]
        results = [r.result() for r in runs]
    assert results[0] == results[1]
