"""Data x sequence parallel: 8 gloo ranks as 2 sequence-parallel groups of 4 and as 4 groups of 2, made up
front on every rank and passed as process_group=. Every distributed class, causal and not, equals the
float64 dense reference of its own group's sequence (each group has a different one, so a transfer that
crossed groups would show), forward and gradients, with no sub-group created and no hang."""

import pytest
import torch

from dattn_cli.kernels import REGISTRY
from dattn_cli.kernels.distributed.sequence_parallel import comm_volume
from dattn_cli.runtime.launch import run_distributed
from dattn_cli.verify.outputs import ReferenceCore
from tests.conftest import rel_err
from tests.distributed import workers

WORLD = 8
STRATEGY = {"RingDilatedAttention": "ring", "DistributedImprovedDilatedAttention": "allgather"}


def reference(impl: str, inputs: list[torch.Tensor], causal: bool) -> dict:
    """The whole sequence's outputs and gradients with the dense reference in place of the attention."""
    q, k, v, up = inputs
    options = dict(workers.DP_SP_IMPLS[impl])
    if REGISTRY[impl].kind == "multihead":
        module = workers.seeded_multihead_module(impl, 11, **options)
        module.attention = ReferenceCore(module.attention, torch.float64)
        x = q.flatten(2).clone().requires_grad_()
        out, _ = module(x, x, x, is_causal=causal)
        grads = torch.autograd.grad(out, [x, *module.parameters()], up.flatten(2))
        return {"out": out, "dx": grads[0], "dparams": grads[1:]}
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = REGISTRY[impl].cls(**options).reference(*xs, causal)
    return {"out": out, "lse": lse, "grads": torch.autograd.grad(out, xs, up)}


def check_group(impl: str, causal: bool, got: list[dict], ref: dict, where) -> None:
    """The group's shards, concatenated (and parameter gradients summed, as DDP would), against ref."""
    if "dx" in ref:
        assert rel_err(torch.cat([r["out"] for r in got], 1), ref["out"]) <= 1e-10, where
        assert rel_err(torch.cat([r["dx"] for r in got], 1), ref["dx"]) <= 1e-10, where
        for j, expected in enumerate(ref["dparams"]):
            assert rel_err(sum(r["dparams"][j] for r in got), expected) <= 1e-10, (where, "parameter", j)
        return
    assert rel_err(torch.cat([r["out"] for r in got], 1), ref["out"]) <= 1e-10, where
    assert rel_err(torch.cat([r["lse"] for r in got], 1), ref["lse"]) <= 1e-6, where  # the reference's lse is fp32
    for j in range(3):
        assert rel_err(torch.cat([r["grads"][j] for r in got], 1), ref["grads"][j]) <= 1e-10, (where, "dq dk dv"[j])


@pytest.mark.slow
@pytest.mark.parametrize("sp", [4, 2])
def test_every_distributed_class_in_data_x_sequence_parallel_groups(sp):
    per_rank = run_distributed(workers.dp_sp_cases, WORLD, sp, timeout_s=300)
    B, N, H, D = workers.DP_SP.values()
    for impl in workers.DP_SP_IMPLS:
        for causal in (False, True):
            outs = []
            for data_index in range(WORLD // sp):
                got = [r[impl, causal] for r in per_rank[data_index * sp : (data_index + 1) * sp]]
                ref = reference(impl, workers.dp_sp_inputs(data_index, causal), causal)
                check_group(impl, causal, got, ref, (impl, sp, causal, data_index))
                outs.append(ref["out"])
                if impl in STRATEGY:  # the all-gather's point-to-point path moves the formula's bytes too
                    pattern = workers.DP_SP_PATTERN
                    expected = comm_volume(
                        STRATEGY[impl],
                        N,
                        sp,
                        B,
                        H,
                        D,
                        8,
                        pattern["segment_lengths"],
                        pattern["dilation_rates"],
                        is_causal=causal,
                    )
                    for member, r in enumerate(got):
                        assert {k: v for k, v in r["comm"].items() if k != "forward_calls"} == expected[member]
            assert not torch.allclose(outs[0], outs[1]), (
                "the groups' sequences must differ for this test to mean anything"
            )


def test_the_layouts_exercise_both_all_gather_paths():
    # sp = 4 (L = 12): segment 24 spans 2 of the 4 ranks (point-to-point), segment 48 all 4 (the collective)
    from dattn_cli.kernels.distributed.sequence_parallel import shard_plan

    pattern = workers.DP_SP_PATTERN
    _, spanning = shard_plan(48, 4, 0, 4, pattern["segment_lengths"], pattern["dilation_rates"], "longnet", "x")
    assert sorted(len(plan.group) for plan in spanning) == [2, 4]
