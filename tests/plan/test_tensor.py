"""plan --tensor-parallel (plan/tensor.py, plan/collectives.py): Megatron tensor parallelism with sequence
parallelism, against the counts written out here."""

import json

import pytest

from dattn_cli.plan import collectives, tensor
from dattn_cli.plan.parallel import Training, model_memory, model_states, model_time
from dattn_cli.plan.profiles import load_profile
from dattn_cli.workload import Problem
from dattn_cli.workload.model_presets import load_preset
from tests.cli.test_verify_env import run_cli

H100 = load_profile("h100-sxm-80gb")


def llama8b(n: int = 65536, **options) -> Problem:
    fields = {"impl": "sdpa", "target": "model", "seq_len": n, "dtype": "bfloat16", "mode": "fwdbwd", **options}
    return Problem(**{**fields, **load_preset("llama-3.1-8b")})


def test_parameters_split_but_the_norms_and_zero_shards_over_the_replicas():
    s, norms = llama8b(), (2 * 32 + 1) * 4096  # RMSNorm weights: two a block and the final one
    total = 8_030_261_248
    assert tensor.device_parameters(s, total, 4) == (total - norms) / 4 + norms
    states = model_states(s, Training(devices=16, tensor_parallel=4, zero=3))
    assert states.resident["parameters (1/4 shard)"] == pytest.approx(((total - norms) / 4 + norms) * 2 / 4)


def test_a_devices_activations_are_the_blocks_on_n_over_t_positions():
    """Korthikanti et al. §4.2.2: with sequence parallelism every saved activation is divided by T."""
    saved = "saved for backward (all blocks)"
    with_tp = model_memory(llama8b(65536), H100, Training(devices=16, tensor_parallel=4, zero=3), "cuda")
    alone = model_memory(llama8b(16384), H100, Training(devices=4, zero=3), "cuda")
    assert with_tp.phase == alone.phase and with_tp.items[saved] == alone.items[saved]
    assert with_tp.items["tensor-parallel all-gathered input"] == 65536 * 4096 * 2  # N x E in bf16


@pytest.mark.parametrize(
    "fields, item",
    [
        ({"fp8": "te"}, "FP8 copies: o_proj input, weights and transposes"),
        ({"amp": "bf16", "dtype": "float32"}, "autocast weight copies"),
    ],
)
def test_a_devices_weight_copies_are_its_shard(fields, item):
    """TransformerEngine's FP8 weights and autocast's half copies are made of the weight a device holds: 1/T."""
    from dattn_cli.plan.layers import block_saved_bytes

    arch = {**load_preset("llama-3.1-8b")}
    if "fp8" in fields:
        arch["architecture"] = arch["architecture"].model_copy(update={"fp8": "te"})
    s = Problem(
        **{**arch, "impl": "sdpa", "target": "model", "seq_len": 16384, "mode": "fwdbwd", "dtype": "bfloat16"}
        | {k: v for k, v in fields.items() if k != "fp8"}
    )
    matmuls = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    per_param = 2
    one, four = block_saved_bytes(s, {}, 1)[item], block_saved_bytes(s, {}, 4)[item]
    assert one - four == per_param * matmuls - per_param * matmuls // 4


@pytest.mark.parametrize("checkpointing, exposed", [(False, 8), (True, 12)])
def test_tensor_parallel_collectives(checkpointing, exposed):
    s = llama8b(8192, checkpointing=checkpointing)
    one = 3 / 4 * 8192 * 4096 * 2  # an all-gather or reduce-scatter of N x E bf16 over 4 devices
    found = collectives.tensor_parallel(s, H100, 4, 8192, checkpointing)
    assert [c.bytes for c in found] == [int(exposed * 32 * one), int(2 * 32 * one)]
    assert found[0].exposed_s == found[0].seconds and found[1].exposed_s == 0.0
    assert collectives.tensor_parallel(s, H100, 1, 8192, checkpointing) == []


def test_compute_divides_by_t_and_its_collectives_cross_nodes_past_a_node():
    s = llama8b(8192)
    alone = model_time(s, H100, Training(devices=1))
    split = model_time(s, H100, Training(devices=4, tensor_parallel=4))
    assert split.compute_s == pytest.approx(alone.compute_s / 4, rel=0.05)  # heads and matmuls over 4
    names = lambda t: {c.name.split(" (")[0]: c.link for c in t.collectives}
    assert names(split)["tensor-parallel all-gathers and reduce-scatters"] == "intra-node"
    small_nodes = H100.model_copy(update={"devices_per_node": 2})
    across = model_time(s, small_nodes, Training(devices=4, tensor_parallel=4))
    assert names(across)["tensor-parallel all-gathers and reduce-scatters"] == "inter-node"


def test_plan_tensor_parallel_from_the_cli(capsys):
    args = ["plan", "--model", "llama-3.1-70b", "--profile", "h100-sxm-80gb", "--seq-len", "16384"]
    args += ["--dtype", "bfloat16", "--devices", "64", "--zero", "1", "--tensor-parallel", "8", "--json", "-"]
    code, stdout, err = run_cli(args, capsys)
    assert code == 0, err
    out = json.loads(stdout)
    assert out["training"]["tensor_parallel"] == 8
    assert Training(devices=64, tensor_parallel=8, zero=1).describe().startswith("64 devices = dp 8 x sp 1 x tp 8;")
    assert any(c["name"].startswith("tensor-parallel") for c in out["time"]["collectives"])


MODEL = ["plan", "--model", "llama-3.1-8b", "--seq-len", "8192", "--dtype", "bfloat16"]


@pytest.mark.parametrize(
    "args, message",
    [
        ([*MODEL, "--devices", "16", "--tensor-parallel", "16"], "does not divide the model's 8 kv heads"),
        ([*MODEL, "--devices", "6", "--tensor-parallel", "3"], "does not divide the model's 32 query heads"),
        ([*MODEL, "--devices", "8", "--tensor-parallel", "3"], "does not divide --devices 8"),
        ([*MODEL, "--devices", "4", "--tensor-parallel", "4", "--impl", "math"], "--tensor-parallel with --impl math"),
        (["plan", "--target", "model", "--seq-len", "8192", "--devices", "2", "--tensor-parallel", "2"], "named model"),
        (["plan", "--seq-len", "8192", "--tensor-parallel", "2"], "apply to --target model"),
        ([*MODEL, "--tensor-parallel", "0"], "--tensor-parallel must be from 1"),
    ],
)
def test_bad_tensor_parallel_input_is_one_line(args, message, capsys):
    code, _, err = run_cli(args, capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_sequence_parallel_group_outside_tensor_parallel_crosses_nodes_at_c_x_t():
    """Ranks of the sp group are T apart: sp 4 x tp 2 fits an 8-GPU node, sp 4 x tp 8 spans four."""
    s = llama8b(131072, checkpointing=True)
    ring = lambda tp: next(
        c
        for c in model_time(s, H100, Training(devices=4 * tp, sequence_parallel=4, tensor_parallel=tp)).collectives
        if c.name.startswith("attention ring")
    )
    assert ring(2).link == "intra-node" and ring(8).link == "inter-node"


def test_a_backward_peak_holds_each_gathered_buffer_once():
    """The gathered input and ZeRO-3's gathered units are forward items the backward phases hold too: once."""
    s = llama8b(65536, checkpointing=True)
    t = Training(devices=16, tensor_parallel=4, zero=3, recompute="full", loss="chunked")
    memory = model_memory(s, H100, t, "cuda")
    assert "backward" in memory.phase, memory.phase
    assert memory.items["tensor-parallel all-gathered input"] == 65536 * 4096 * 2
    block, _ = tensor.block_unit(s, 218_112_000, 4)  # 218,103,808 in matmuls, two RMSNorms of 4,096
    assert memory.items["all-gathered parameters (unit in use + prefetched)"] == max(
        2 * block * 2, 128256 * 4096 / 4 * 2 + block * 2
    )


def test_forward_only_recomputes_nothing():
    s = llama8b(8192, checkpointing=True, mode="fwd")
    assert collectives.tensor_parallel(s, H100, 4, 8192, False)[0].bytes == int(4 * 32 * 3 / 4 * 8192 * 4096 * 2)
    names = {c.name: c.bytes for c in model_time(s, H100, Training(devices=4, tensor_parallel=4)).collectives}
    assert names["tensor-parallel all-gathers and reduce-scatters (32 blocks)"] == int(4 * 32 * 3 / 4 * 8192 * 4096 * 2)


def test_offloaded_activations_are_the_devices_share():

    s = llama8b(131072, checkpointing=True)
    host = {}
    for tp in (1, 4):
        t = Training(devices=8, tensor_parallel=tp, zero=3, recompute="full", offload=("activations",))
        host[tp] = model_time(s, H100, t).collectives
    copies = lambda tp: sum(c.bytes for c in host[tp] if c.link == "host")
    assert copies(4) == pytest.approx(copies(1) / 4, rel=0.01)
