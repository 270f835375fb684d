"""The multihead wrappers of the all-gather and head-parallel forms on 2 and 3 gloo ranks: out and dx shards
concatenated, parameter gradients summed over ranks (as DDP would), equal the same module with the float64
dense reference as its attention; bytes equal the forms' formulas."""

import pytest
import torch

from dattn_cli.kernels import REGISTRY
from dattn_cli.kernels.distributed.sequence_parallel import comm_volume
from dattn_cli.runtime.launch import run_distributed
from dattn_cli.verify.outputs import ReferenceCore
from tests.conftest import rel_err
from tests.distributed import workers

WRAPPERS = ["DistributedImprovedMultiheadDilatedAttention", "HeadParallelMultiheadDilatedAttention"]


def reference(impl: str, causal: bool) -> dict:
    w = workers.WRAPPER
    module = workers.seeded_multihead_module(
        impl, 5, num_heads=w["H"], segment_lengths=w["segment_lengths"], dilation_rates=w["dilation_rates"]
    )
    module.attention = ReferenceCore(module.attention, torch.float64)
    q, _, _, up = workers.wrapper_inputs(causal)
    x = q.flatten(2).clone().requires_grad_()
    out, _ = module(x, x, x, is_causal=causal)
    grads = torch.autograd.grad(out, [x, *module.parameters()], up.flatten(2))
    return {"out": out, "dx": grads[0], "dparams": grads[1:]}


def expected_bytes(impl: str, world: int, causal: bool) -> list[dict]:
    w, B, D, e = workers.WRAPPER, 2, workers.DP_SP["D"], 8
    if impl.startswith("HeadParallel"):  # q, k, v and out each move (p-1)/p of the shard, both ways
        shard = B * (w["N"] // world) * w["H"] * D * e
        moved = 4 * (shard * (world - 1) // world)
        return [
            dict.fromkeys(
                ("forward_bytes_sent", "forward_bytes_received", "backward_bytes_sent", "backward_bytes_received"),
                moved,
            )
        ] * world
    return comm_volume(
        "allgather", w["N"], world, B, w["H"], D, e, w["segment_lengths"], w["dilation_rates"], is_causal=causal
    )


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("impl", WRAPPERS)
def test_wrapper_shards_equal_the_reference(impl, world):
    per_rank = run_distributed(workers.multihead_wrapper_outputs, world, impl, timeout_s=120)
    for causal in (False, True):
        ref, where = reference(impl, causal), (impl, world, causal)
        got = [r[causal] for r in per_rank]
        assert rel_err(torch.cat([r["out"] for r in got], 1), ref["out"]) <= 1e-10, where
        assert rel_err(torch.cat([r["dx"] for r in got], 1), ref["dx"]) <= 1e-10, where
        assert len(ref["dparams"]) == len(got[0]["dparams"]) == 6  # in_proj, norm and out_proj weights and biases
        for j, expected in enumerate(ref["dparams"]):
            assert rel_err(sum(r["dparams"][j] for r in got), expected) <= 1e-10, (where, "parameter", j)
        for rank, r in enumerate(got):
            comm = {k: v for k, v in r["comm"].items() if k != "forward_calls"}
            assert comm == expected_bytes(impl, world, causal)[rank], (where, rank)
            assert comm["forward_bytes_sent"] > 0


def test_wrappers_wrap_their_forms_and_are_registered_like_ring():
    for impl, core in (
        ("DistributedImprovedMultiheadDilatedAttention", "DistributedImprovedDilatedAttention"),
        ("HeadParallelMultiheadDilatedAttention", "HeadParallelDilatedAttention"),
    ):
        spec = REGISTRY[impl]
        assert spec.kind == "multihead" and spec.cls.attention_class is REGISTRY[core].cls
        assert (spec.strategy, spec.distributed, spec.single_device, spec.shard_rule) == (
            REGISTRY[core].strategy,
            True,
            False,
            REGISTRY[core].shard_rule,
        )
