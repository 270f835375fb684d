"""Dense context parallelism (plan/context.py, plan --sp-kind): a named model's dense attention split over the
sequence-parallel devices by the kind's own distributed core over one segment of N, at the dense kernel's curve."""

import json

import pytest

from dattn_cli.plan import solve
from dattn_cli.plan.layers import attention_call
from dattn_cli.plan.parallel import Training
from dattn_cli.plan.profiles import load_profile
from dattn_cli.workload import Problem
from dattn_cli.workload.model_presets import load_preset
from tests.cli.test_verify_env import run_cli

H100 = load_profile("h100-sxm-80gb")


def llama8b(n: int = 131072, **options) -> Problem:
    fields = {"impl": "sdpa", "target": "model", "seq_len": n, "dtype": "bfloat16", "mode": "fwdbwd", **options}
    return Problem(**{**fields, **load_preset("llama-3.1-8b")})


@pytest.mark.parametrize(
    "kind, impl",
    [
        (None, "RingDilatedAttention"),
        ("ring", "RingDilatedAttention"),
        ("allgather", "DistributedImprovedDilatedAttention"),
        ("head_parallel", "HeadParallelDilatedAttention"),
        ("hybrid", "HybridDilatedAttention"),
    ],
)
def test_a_dense_attention_is_split_by_its_kind_over_one_segment_of_n(kind, impl):
    call = attention_call(llama8b(sp_kind=kind), 8)
    assert (call.impl, call.segment_lengths, call.dilation_rates, call.world_size) == (impl, [131072], [1], 8)
    assert call.backend == "sdpa" and call.heads == 32 and call.kv_heads == 8  # the --impl's kernel and the GQA
    assert attention_call(llama8b(impl="flash", sp_kind=kind), 8).backend == "flash"
    assert attention_call(llama8b(sp_kind=kind), 1).impl == "sdpa"  # one device: the dense kernel itself


def test_the_segment_follows_n_as_max_seq_searches():
    t = Training(devices=8, sequence_parallel=8, zero=3, recompute="full", loss="chunked")
    s = llama8b(checkpointing=True)
    n, found = solve.max_seq(s, H100, training=t)
    assert n > 131072 and found.fits and n % 8 == 0
    assert attention_call(found.problem, 8).segment_lengths == [n]


def test_plan_dense_context_parallelism_from_the_cli(capsys):
    args = ["plan", "--model", "llama-3.1-8b", "--profile", "h100-sxm-80gb", "--seq-len", "128k", "--dtype"]
    args += ["bfloat16", "--checkpointing", "--loss", "chunked", "--devices", "32", "--sequence-parallel", "8"]
    found = {}
    for kind in ("ring", "allgather", "head_parallel"):
        code, stdout, err = run_cli([*args, "--zero", "3", "--sp-kind", kind, "--json", "-"], capsys)
        assert code == 0, err
        found[kind] = json.loads(stdout)
        assert found[kind]["problem"]["sp_kind"] == kind and found[kind]["fits"]
        names = [c["name"] for c in found[kind]["time"]["collectives"]]
        assert any(name.startswith(f"attention {kind} (sequence parallel") for name in names), names
    # all-gather holds every K/V of the sequence: more memory than the ring's two chunks (NCCL's buffers apart:
    # the ring's send/recv has its own)
    held = lambda kind: sum(v for k, v in found[kind]["memory"]["items"].items() if not k.startswith("NCCL"))
    assert held("allgather") > held("ring")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "llama-3.1-8b", "--sp-kind", "ring"], "--sp-kind ring splits the sequence over"),
        (["--seq-len", "8192", "--sp-kind", "ring"], "apply to --target model"),
        (
            ["--target", "model", "--devices", "2", "--sequence-parallel", "2", "--sp-kind", "allgather"]
            + ["--impl", "RingMultiheadDilatedAttention"],
            "is a ring implementation: drop --sp-kind allgather, or give --impl "
            "DistributedImprovedMultiheadDilatedAttention",
        ),
    ],
)
def test_bad_sp_kind_input_is_one_line(args, message, capsys):
    code, _, err = run_cli(["plan", *args], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_longnet_model_takes_the_multihead_class_of_the_kind(capsys):
    args = ["plan", "--target", "model", "--seq-len", "8192", "--devices", "2", "--sequence-parallel", "2"]
    code, stdout, err = run_cli([*args, "--sp-kind", "allgather", "--json", "-"], capsys)
    assert code == 0, err
    assert json.loads(stdout)["problem"]["impl"] == "DistributedImprovedMultiheadDilatedAttention"


def test_zigzag_is_a_layout_of_the_ring_and_allgather_kinds_only():
    assert llama8b(sp_kind="allgather", layout="zigzag").layout == "zigzag"
    assert attention_call(llama8b(layout="zigzag"), 8).layout == "zigzag"
    with pytest.raises(ValueError, match="--layout zigzag"):
        llama8b(sp_kind="head_parallel", layout="zigzag")


@pytest.mark.parametrize("sp, kv_per_rank", [(8, 1), (32, 1)])
def test_a_dense_attention_split_by_heads_is_the_kernel_on_the_head_shard(sp, kv_per_rank):
    """head_parallel of a dense attention (DeepSpeed's DistributedAttention): no local q, k, v kept; the head shard's
    q, k, v, out (kv heads replicated when fewer than C) and the backward's head-shard gradients, one all-to-all copy
    and the fp32 dq accumulator; not the blocked engine's items."""
    from dattn_cli.plan.context import attention_items

    n = 262144
    call = attention_call(llama8b(n, sp_kind="head_parallel", checkpointing=True), sp)
    items = attention_items(call, "cuda")
    x = n * (32 // sp) * 128 * 2  # the head shard's q = the local q, in bf16
    k_h = n * kv_per_rank * 128 * 2
    assert items["inputs q, k, v"] == 0 and items["output"] == x
    assert items["head-shard q, k, v, out"] == 2 * x + 2 * k_h
    assert items["gradients (upstream, dq, dk, dv)"] == 2 * x + 2 * k_h and items["all-to-all copies"] == x
    assert items["kernel workspace"] == 2 * x and "block results (one-pass combine)" not in items
    engine = attention_call(
        llama8b(n, impl="HeadParallelDilatedAttention", segment_lengths=[n], dilation_rates=[1]), sp
    )
    assert "inputs q, k, v" in attention_items(engine, "cuda") and attention_items(engine, "cuda")["inputs q, k, v"]


def test_what_the_head_split_keeps_is_counted_once_at_its_backward():
    """The head shard's q, k, v, out are in the recomputed block's saved set, not again among the backward's
    transients."""
    from dattn_cli.plan.context import attention_items

    s = llama8b(1 << 20, sp_kind="head_parallel", checkpointing=True)
    s = s.model_copy(update={"architecture": s.arch.model_copy(update={"tiled_mlp": True})})  # the MLP off the peak
    call = attention_call(s, 8)
    items = attention_items(call, "cuda")
    memory = solve.plan(s, H100, training=Training(devices=8, sequence_parallel=8, zero=3, loss="chunked")).memory
    assert memory.phase == "last block's backward (attention)"
    local = 1 << 17  # N / 8 positions
    residual, packed_qkv = 2 * local * 4096 * 2, local * (4096 + 2 * 1024) * 2
    transients = sum(items[k] for k in ("gradients (upstream, dq, dk, dv)", "all-to-all copies", "kernel workspace"))
    key = "residual gradients, packed dq/dk/dv, attention gradients and scratch"
    assert memory.items[key] == residual + packed_qkv + transients
    assert memory.items["recomputed block: saved for backward"] > items["head-shard q, k, v, out"] > 0


def test_the_hybrid_is_a_ring_on_the_head_shard_between_all_to_alls():
    """USP: h = 2 head ranks (the default), a ring of C / h on H / h heads; plus the output's local copy and the
    upstream gradient's head-shard copy. The plan fits where it was refused for want of a memory model."""
    from dattn_cli.plan.context import attention_items
    from dattn_cli.plan.memory import estimate_memory

    n, sp = 131072, 8
    s = llama8b(n, sp_kind="hybrid", checkpointing=True)
    call = attention_call(s, sp)
    ring = call.model_copy(
        update={"impl": "RingDilatedAttention", "sp_kind": "ring", "world_size": sp // 2, "heads": 16, "kv_heads": 4}
    )
    x = (n // sp) * 32 * 128 * 2
    expected = estimate_memory(ring, 0, "cuda").items
    items = attention_items(call, "cuda")
    assert items["output"] == expected["output"] + x and items["all-to-all copies"] == x
    assert {k: v for k, v in items.items() if k not in ("output", "all-to-all copies")} == {
        k: v for k, v in expected.items() if k != "output"
    }
    plan = solve.plan(s, H100, training=Training(devices=32, sequence_parallel=sp, zero=3, loss="chunked"))
    assert plan.feasible and plan.memory.total > 0


@pytest.mark.parametrize("kind, ring", [("ring", 8), ("allgather", 8), ("hybrid", 4)])
def test_contiguous_causal_shards_pay_their_imbalance_zigzag_does_not(kind, ring):
    """The last rank of a causal split on contiguous shards computes C - 1/2 blocks where the mean is C/2."""
    from dattn_cli.plan.context import CP_ATTENTION_EFFICIENCY, split_rate

    layout = dict(devices=32, sequence_parallel=8, zero=3, loss="chunked")
    times = {}
    for shards in ("contiguous", "zigzag"):
        s = llama8b(131072, sp_kind=kind, checkpointing=True, layout=shards)
        times[shards] = solve.plan(s, H100, training=Training(**layout)).time.attention_s
        assert split_rate(attention_call(s, 8)) == pytest.approx(
            CP_ATTENTION_EFFICIENCY / ((2 * ring - 1) / ring if shards == "contiguous" else 1)
        )
    assert times["contiguous"] / times["zigzag"] == pytest.approx((2 * ring - 1) / ring)
