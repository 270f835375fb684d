"""Whole-model plans across devices (plan/parallel.py): model states per ZeRO stage and optimizer, the
data-parallel collectives and their overlap, sequence parallel layouts, and `plan --target model --devices`."""

import json

import pytest

from dattn_cli.plan import solve
from dattn_cli.plan.layers import model_parameters
from dattn_cli.plan.parallel import Training, model_states, model_time
from dattn_cli.plan.profiles import load_profile
from dattn_cli.workload import Problem
from tests.cli.test_verify_env import run_cli

H100 = load_profile("h100-sxm-80gb")


def llm(**overrides) -> Problem:
    """A 7B-class LongNetLM: 32 layers, width 4096, 32 heads."""
    fields = dict(
        impl="ImprovedMultiheadDilatedAttention",
        target="model",
        layers=32,
        embed_dim=4096,
        heads=32,
        seq_len=4096,
        dtype="bfloat16",
        mode="fwdbwd",
        segment_lengths=[2048, 4096],
        dilation_rates=[1, 2],
    )
    return Problem(**{**fields, **overrides})


def test_a_7b_model_with_adamw_needs_more_than_one_80gb_gpu_and_fits_with_zero3():
    s = llm()
    params = model_parameters(s)
    one = solve.plan(s, H100, training=Training())
    assert not one.fits and one.memory.total > 100 * 2**30
    assert one.memory.items["optimizer states"] == 8 * params  # exp_avg, exp_avg_sq in fp32
    assert one.memory.items["fp32 master weights"] == 4 * params  # half weights train against an fp32 copy
    sharded = solve.plan(s, H100, training=Training(devices=8, zero=3))
    assert sharded.fits and sharded.devices == 8
    assert sharded.memory.items["parameters (1/8 shard)"] == pytest.approx(2 * params / 8, abs=1)
    assert sharded.memory.items["optimizer states (1/8 shard)"] == pytest.approx(8 * params / 8, abs=1)
    # the bench's optimizer (states in the weight dtype, no master copy) is what made it look like it fit
    assert solve.plan(s, H100, training=Training(optimizer="torch-adamw")).fits


@pytest.mark.parametrize(
    "optimizer, state_bytes", [("adamw", 8), ("adam8bit", 2 + 8 / 256), ("sgd", 4), ("torch-adamw", 8)]
)
def test_optimizer_state_bytes_per_parameter(optimizer, state_bytes):
    s = llm(dtype="float32", layers=2)  # fp32 weights are their own master copy
    states = model_states(s, Training(optimizer=optimizer))
    assert states.resident["optimizer states"] == pytest.approx(state_bytes * model_parameters(s), rel=1e-9)
    assert "fp32 master weights" not in states.resident


def test_each_zero_stage_shards_more_and_ddp_keeps_bucket_copies():
    s, n = llm(), 8
    params, p = model_parameters(s), 2
    totals = {z: solve.plan(s, H100, training=Training(devices=n, zero=z)).memory.total for z in range(4)}
    assert totals[0] > totals[1] >= totals[2] > totals[3]
    ddp = model_states(s, Training(devices=n, zero=0)).resident
    assert ddp["DDP gradient buckets (all-reduce copies)"] == params * p
    z1, z2 = (model_states(s, Training(devices=n, zero=z)) for z in (1, 2))
    assert z1.step["gradients"] == params * p and z2.step["gradients (1/8 shard)"] == pytest.approx(
        params * p / n, abs=1
    )
    z3 = model_states(s, Training(devices=n, zero=3))
    assert z3.forward["all-gathered parameters (unit in use + prefetched)"] > 0


def test_collective_bytes_and_the_link():
    s = llm()
    grads = model_parameters(s) * 2
    for n in (8, 16):
        ddp = model_time(s, H100, Training(devices=n, zero=0)).collectives
        assert [c.name for c in ddp] == ["DDP all-reduce of gradients"]
        assert ddp[0].bytes == int(2 * (n - 1) / n * grads)
        assert ddp[0].link == ("intra-node" if n <= H100.devices_per_node else "inter-node")
        fsdp = model_time(s, H100, Training(devices=n, zero=3)).collectives
        assert len(fsdp) == 3 and sum(c.bytes for c in fsdp) == pytest.approx(3 * (n - 1) / n * grads, rel=1e-6)
    slow = model_time(s, H100, Training(devices=16, zero=3))
    fast = model_time(s, H100, Training(devices=8, zero=3))
    assert slow.collectives[0].seconds > 5 * fast.collectives[0].seconds  # inter-node: 50 against 450 GB/s


def test_overlap_hides_what_the_compute_covers_and_exposes_the_rest():
    s = llm()
    quick = model_time(s, H100, Training(devices=8, zero=0))
    assert quick.collectives[0].exposed_s < 0.05 * quick.collectives[0].seconds  # only the last 25 MiB bucket
    narrow = H100.model_copy(update={"intra_node": H100.intra_node.model_copy(update={"bandwidth_gb_s": 5.0})})
    slow = model_time(s, narrow, Training(devices=8, zero=0))
    backward = slow.compute_s * 2 / 3
    assert slow.collectives[0].exposed_s == pytest.approx(slow.collectives[0].seconds - backward, rel=0.05)
    assert slow.total_s > slow.compute_s + slow.collectives[0].seconds - backward


def test_sequence_parallel_shards_the_activations():
    s = llm(impl="RingMultiheadDilatedAttention", seq_len=32768, segment_lengths=[4096, 8192], checkpointing=True)
    one = solve.plan(s, H100, training=Training(devices=8, zero=3))
    two = solve.plan(s, H100, training=Training(devices=8, sequence_parallel=2, zero=3))
    assert two.shard_len == 16384 and one.shard_len is None
    assert two.memory.items["checkpointed block inputs"] * 2 == one.memory.items["checkpointed block inputs"]
    assert two.time.compute_s < 0.6 * one.time.compute_s
    assert any("ring" in c.name for c in two.time.collectives)


def test_fewest_devices_for_a_model_shrink_with_the_zero_stage():
    s = llm()
    counts = {z: solve.min_model_devices(s, H100, Training(zero=z))[0] for z in range(4)}
    assert counts[0] is None  # DDP replicates every state: no number of devices fits a 7B with AdamW
    assert counts[3] <= counts[2] <= counts[1] and counts[3] >= 2
    d, p = solve.min_model_devices(s, H100, Training(zero=3))
    assert p.fits and not solve.plan(s, H100, training=Training(devices=d - 1, zero=3)).fits
    ring = llm(impl="RingMultiheadDilatedAttention")
    assert solve.min_model_devices(ring, H100, Training(devices=2, sequence_parallel=2, zero=3))[0] % 2 == 0


def test_layout_errors_name_the_option():
    with pytest.raises(ValueError, match="--sequence-parallel 3 does not divide --devices 4"):
        Training(devices=4, sequence_parallel=3)
    bad = solve.plan(llm(), H100, training=Training(devices=2, sequence_parallel=2))
    assert not bad.feasible and "--sequence-parallel 2 needs a distributed multihead --impl" in bad.reason


def test_plan_cli_model_over_devices(tmp_path, capsys):
    out = tmp_path / "p.json"
    base = [
        "plan",
        "--target",
        "model",
        "--layers",
        "32",
        "--embed-dim",
        "4096",
        "--heads",
        "32",
        "--seq-len",
        "4k",
        "--dtype",
        "bfloat16",
        "--profile",
        "h100-sxm-80gb",
    ]
    code, stdout, err = run_cli([*base, "--fail-if-infeasible"], capsys)
    assert code == 1 and "does not fit" in stdout and "fp32 master weights" in stdout
    code, stdout, err = run_cli([*base, "--devices", "8", "--zero", "3", "--json", str(out)], capsys)
    assert code == 0, err
    assert "ZeRO-3" in stdout and "FSDP all-gather (forward)" in stdout and "exposed" in stdout
    data = json.loads(out.read_text())
    assert data["devices"] == 8 and data["training"]["zero"] == 3 and data["time"]["collectives"]
    code, stdout, err = run_cli([*base, "--min-devices", "--zero", "3"], capsys)
    assert code == 0 and "fewest devices for this model's step with --zero 3: 2" in " ".join(stdout.split()), stdout
    code, stdout, err = run_cli([*base, "--min-devices"], capsys)
    assert code == 0 and "no number of devices fits" in stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--zero", "2"], "apply to --target model"),
        (["--target", "model", "--zero", "4"], "--zero '4': use 0, 1, 2 or 3"),
        (["--target", "model", "--optimizer", "lion"], "--optimizer 'lion'"),
        (["--target", "model", "--devices", "4", "--sequence-parallel", "3"], "does not divide --devices 4"),
        (
            [
                "--target",
                "model",
                "--devices",
                "2",
                "--sequence-parallel",
                "2",
                "--impl",
                "ImprovedMultiheadDilatedAttention",
            ],
            "needs a distributed multihead --impl",
        ),
    ],
)
def test_plan_cli_layout_errors_are_one_line(args, message, capsys):
    code, _, err = run_cli(["plan", *args], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_shard_that_is_not_a_whole_byte_count_rounds_up():
    """P x p / n need not be an integer (8B bf16 weights over 400 devices): every item is whole bytes."""
    from dattn_cli.workload.model_presets import load_preset

    fields = {"impl": "sdpa", "target": "model", "seq_len": 2048, "dtype": "float16", "mode": "fwdbwd"}
    s = Problem(**{**fields, **load_preset("llama-3.1-8b")})
    states = model_states(s, Training(devices=400, zero=3))
    shard = states.resident["parameters (1/400 shard)"]
    assert isinstance(shard, int) and shard == -(-8_030_261_248 * 2 // 400)
    assert solve.plan(s, load_profile("h100-sxm-80gb"), training=Training(devices=400, zero=3)).time is not None


def test_hsdp_shards_over_its_group_and_all_reduces_across_the_copies():
    """--dp-shard 8 of 64 (FSDP2's hybrid shard): states over 8, the gathers inside a node, the gradient shards
    all-reduced across the 8 copies over the inter-node link, 2(r-1)/r of a shard."""
    from dattn_cli.workload.model_presets import load_preset

    fields = {"impl": "sdpa", "target": "model", "seq_len": 8192, "dtype": "bfloat16", "mode": "fwdbwd"}
    s = Problem(**{**fields, **load_preset("llama-3.1-8b"), "checkpointing": True})
    h100 = load_profile("h100-sxm-80gb")
    hsdp = Training(devices=64, zero=3, dp_shard=8)
    states = model_states(s, hsdp)
    total = 8_030_261_248 * 2
    assert states.resident["parameters (1/8 shard)"] == -(-total // 8)
    plan = solve.plan(s, h100, training=hsdp)
    by_name = {c.name: c for c in plan.time.collectives}
    assert by_name["FSDP all-gather (forward)"].link == "intra-node"
    across = by_name["HSDP all-reduce of gradient shards across 8 copies"]
    assert across.link == "inter-node" and across.bytes == pytest.approx(2 * 7 / 8 * total / 8, rel=1e-6)
    flat = solve.plan(s, h100, training=Training(devices=64, zero=3))
    assert {c.link for c in flat.time.collectives} == {"inter-node"} and plan.memory.total > flat.memory.total
    assert "(HSDP)" in hsdp.describe()


@pytest.mark.parametrize(
    "extra, message",
    [(["--dp-shard", "3"], "--dp-shard 3 must divide the 64 devices"), (["--zero", "0"], "with --zero 1, 2 or 3")],
)
def test_bad_dp_shard_is_one_line(extra, message, capsys):
    args = ["plan", "--model", "llama-3.1-8b", "--profile", "h100-sxm-80gb", "--dtype", "bfloat16", "--devices", "64"]
    args += ["--zero", "3", "--dp-shard", "8"] if "--dp-shard" not in extra else ["--zero", "3"]
    code, _, err = run_cli([*args, *extra], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
