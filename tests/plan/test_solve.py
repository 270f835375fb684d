"""Solvers are monotone; the time model's pieces add up; plan CLI outputs, exit codes, check, calibrate."""

import json

import pytest

from dattn_cli.plan import solve
from dattn_cli.plan.profiles import load_profile
from dattn_cli.plan.time import estimate_time
from dattn_cli.workload import Problem
from tests.cli.test_verify_env import run_cli

H100 = load_profile("h100-sxm-80gb")
RING = Problem(impl="RingDilatedAttention", seq_len=1 << 20, dtype="bfloat16", mode="fwdbwd")


def test_more_devices_never_lower_max_seq():
    previous = 0
    for devices in (1, 2, 4, 8, 16):
        n, _ = solve.max_seq(RING, H100, devices)
        assert n >= previous
        previous = n


def test_longer_sequences_never_need_fewer_devices():
    previous = 1
    for n in (1 << 22, 1 << 24, 1 << 26, 1 << 27):
        d, p = solve.min_devices(RING.model_copy(update={"seq_len": n}), H100)
        assert d is not None and d >= previous and p.fits
        previous = d


def test_max_seq_is_the_boundary():
    shape = Problem(impl="ImprovedDilatedAttention", seq_len=1)
    cpu = load_profile("cpu-host")
    n, p = solve.max_seq(shape, cpu)
    assert p.fits and not solve.plan(shape.model_copy(update={"seq_len": n + 2 * 8192}), cpu).fits


def test_ring_time_counts_comm_from_the_closed_form():
    from dattn_cli.kernels.distributed.sequence_parallel import comm_volume

    shape = Problem(
        impl="RingDilatedAttention",
        seq_len=65536,
        segment_lengths=[2048, 8192, 32768],
        dilation_rates=[1, 2, 8],
        mode="fwd",
        world_size=4,
    )
    t = estimate_time(shape, H100)
    expected = max(
        c["forward_bytes_received"] for c in comm_volume("ring", 65536, 4, 1, 8, 64, 4, [2048, 8192, 32768], [1, 2, 8])
    )
    assert t.comm_bytes == expected == 2 * (16384 // 8) * 8 * 64 * 4
    link = H100.intra_node
    assert t.comm_s == pytest.approx(
        t.messages * link.latency_us * 1e-6 + expected / (link.bandwidth_gb_s * 1e9 * H100.efficiency.communication)
    )


@pytest.mark.parametrize(
    "impl, strategy", [("RingDilatedAttention", "ring"), ("DistributedImprovedDilatedAttention", "allgather")]
)
@pytest.mark.parametrize(
    "seq_len, world, segments", [(50000, 3, [4096, 65536]), (100000, 6, [16384, 65536]), (10000, 4, [1000, 10000])]
)
def test_any_n_over_any_p_plans_the_padded_shards(impl, strategy, seq_len, world, segments):
    """N not divisible by p, segments neither dividing nor multiples of N/p: the planner takes the kernels'
    padded shard (registry.shard_length) and its bytes are the closed form on the padded length."""
    from dattn_cli.kernels import padded_length
    from dattn_cli.kernels.distributed.sequence_parallel import comm_volume

    shape = Problem(
        impl=impl,
        seq_len=seq_len,
        segment_lengths=segments,
        dilation_rates=[1, 2],
        mode="fwdbwd",
        world_size=world,
        heads=8,
    )
    padded = padded_length(seq_len, world, segments)
    t = estimate_time(shape, H100)
    volume = comm_volume(strategy, padded, world, 1, 8, 64, 4, segments, [1, 2])
    expected = max(c["forward_bytes_received"] + c["backward_bytes_received"] for c in volume)
    assert padded > seq_len and t.comm_bytes == expected > 0
    plan = solve.plan(shape, H100)
    assert plan.memory.items["inputs q, k, v"] == 3 * (padded // world) * 8 * 64 * 4
    assert plan.shard_len * world == padded


def test_layouts_the_kernels_refuse_are_not_planned():
    # padding 10000 to 84000 (shards aligned with 3000 and 7000 over 4 ranks) is beyond the 4x N the kernels pad
    shape = Problem(
        impl="RingDilatedAttention", seq_len=10000, segment_lengths=[3000, 7000], dilation_rates=[1, 2], world_size=4
    )
    refused = solve.plan(shape, H100)
    assert not refused.feasible and "cannot shard N=10,000 over 4 devices" in refused.reason
    heads = solve.plan(Problem(impl="HeadParallelDilatedAttention", seq_len=8192, heads=6, world_size=4), H100)
    assert not heads.feasible and "heads" in heads.reason


def test_head_parallel_volume_by_hand():
    shape = Problem(impl="HeadParallelDilatedAttention", seq_len=8192, mode="fwd", world_size=4)
    t = estimate_time(shape, H100)
    assert t.comm_bytes == 4 * (1 * 2048 * 8 * 64 * 4) * 3 // 4
    uneven = estimate_time(shape.model_copy(update={"seq_len": 8190}), H100)  # shards of ceil(8190/4) = 2048
    assert uneven.comm_bytes == t.comm_bytes


def test_plan_cli_json_and_infeasible_exit(tmp_path, capsys):
    out = tmp_path / "p.json"
    code, stdout, _ = run_cli(
        [
            "plan",
            "--impl",
            "RingDilatedAttention",
            "--profile",
            "h100-sxm-80gb",
            "--seq-len",
            "1m",
            "--world-size",
            "4",
            "--dtype",
            "bfloat16",
            "--json",
            str(out),
        ],
        capsys,
    )
    assert code == 0 and "peak memory" in stdout and "time per call" in stdout
    data = json.loads(out.read_text())
    assert data["feasible"] and data["memory"]["total"] == sum(data["memory"]["items"].values())
    code, _, _ = run_cli(
        [
            "plan",
            "--impl",
            "sdpa",
            "--profile",
            "gtx-1080",
            "--seq-len",
            "1m",
            "--dtype",
            "float16",
            "--fail-if-infeasible",
        ],
        capsys,
    )
    assert code == 1


def test_plan_old_option_names_still_work_with_a_note(tmp_path, capsys):
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    args = ["plan", "--impl", "RingDilatedAttention", "--seq-len", "256k"]
    code, _, err = run_cli([*args, "--world-size", "4", "--max-memory", "8GiB", "--json", str(new)], capsys)
    assert code == 0 and "deprecated" not in err
    code, _, err = run_cli([*args, "--devices", "4", "--memory", "8GiB", "--json", str(old)], capsys)
    assert code == 0
    assert (
        "--memory is deprecated, use --max-memory" in err and "--devices" not in err
    )  # --devices: a name of --world-size
    assert json.loads(old.read_text()) == json.loads(new.read_text())
    assert json.loads(new.read_text())["devices"] == 4


def test_check_and_calibrate_on_a_small_report(tmp_path, capsys):
    report = tmp_path / "r.jsonl"
    code, _, err = run_cli(
        [
            "bench",
            "--impl",
            "ImprovedDilatedAttention",
            "--impl",
            "sdpa",
            "--seq-len",
            "1k,2k",
            "--segments",
            "256,512",
            "--dilations",
            "1,2",
            "--mode",
            "fwd",
            "--repeat",
            "1",
            "--out",
            str(report),
        ],
        capsys,
    )
    assert code == 0, err
    code, stdout, _ = run_cli(["plan", "--check", str(report), "--profile", "cpu-host"], capsys)
    assert code == 0 and "memory error median" in stdout
    saved = tmp_path / "mine.yaml"
    code, _, err = run_cli(["plan", "--calibrate", str(report), "--profile", "cpu-host", "--save", str(saved)], capsys)
    assert code == 0, err
    calibrated = load_profile(saved)
    assert set(calibrated.efficiency.per_impl) == {"ImprovedDilatedAttention/fwd", "sdpa/fwd"}
    assert calibrated.calibrated_from == str(report)


def test_check_needs_ok_rows(tmp_path, capsys):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    code, _, err = run_cli(["plan", "--check", str(empty)], capsys)
    assert code == 2 and "no ok rows" in err


def test_headroom_free_memory_and_the_largest_n_and_batch_that_fit():
    """Issue 19 item 4: a plan states what is left, and the largest N and batch are tight (one more does not fit)."""
    h100 = load_profile("h100-sxm-80gb")
    s = Problem(impl="ImprovedDilatedAttention", seq_len=1 << 20, dtype="bfloat16", mode="fwdbwd", device="cuda")
    result = solve.plan(s, h100)
    room = solve.headroom(result, h100)
    assert room.free_bytes == result.capacity_bytes - result.memory.total > 0
    assert room.largest_seq_len == solve.max_seq(s, h100)[0] >= s.seq_len
    b = room.largest_batch
    assert b >= 1 and not room.batch_capped
    assert solve.plan(s.model_copy(update={"batch": b}), h100).fits
    assert not solve.plan(s.model_copy(update={"batch": b + 1}), h100).fits


def test_headroom_of_a_plan_that_does_not_fit_names_the_excess():
    h100 = load_profile("h100-sxm-80gb")
    s = Problem(impl="ImprovedDilatedAttention", seq_len=1 << 24, dtype="bfloat16", mode="fwdbwd", device="cuda")
    room = solve.headroom(solve.plan(s, h100), h100)
    assert room.free_bytes < 0 and room.largest_batch is None
    assert 0 < room.largest_seq_len < s.seq_len


def test_cli_7b_on_one_gpu_says_no_n_fits_and_fails_if_asked(capsys):
    args = [
        "plan",
        "--profile",
        "h100-sxm-80gb",
        "--target",
        "model",
        "--layers",
        "32",
        "--embed-dim",
        "4096",
        "--heads",
        "32",
        "--dtype",
        "bfloat16",
        "--mode",
        "fwdbwd",
        "--seq-len",
        "4096",
    ]
    code, out, _ = run_cli([*args, "--json", "-"], capsys)
    assert code == 0
    room = json.loads(out)["headroom"]
    assert room["free_bytes"] < 0 and room["largest_seq_len"] is None and room["largest_batch"] is None
    code, out, _ = run_cli([*args, "--fail-if-infeasible"], capsys)
    assert code == 1 and "no N fits at batch 1" in out.replace("\n", " ").replace("│", " ")


def test_a_gpu_plan_states_its_reserved_peak_and_fits_on_allocated(capsys):
    from dattn_cli.plan.memory import ALLOCATOR_MARGIN

    p = solve.plan(RING.model_copy(update={"world_size": 4}), H100)
    framework = p.memory.items["framework"]
    assert p.reserved_bytes == int(framework + (p.memory.total - framework) * (1 + ALLOCATOR_MARGIN))
    tight = H100.model_copy(update={"memory_gib": (p.memory.total + p.reserved_bytes) / 2 / 2**30})
    p = solve.plan(RING.model_copy(update={"world_size": 4}), tight)  # allocated fits, reserved would not
    assert p.memory.total <= p.capacity_bytes < p.reserved_bytes and p.fits  # the margin is reported, not judged
    assert solve.plan(Problem(seq_len=4096), load_profile("cpu-host")).reserved_bytes is None
    code, stdout, err = run_cli(["plan", "--profile", "h100-sxm-80gb", "--seq-len", "64k", "--json", "-"], capsys)
    assert code == 0 and json.loads(stdout)["reserved_bytes"] > json.loads(stdout)["memory"]["total"], err
    code, stdout, _ = run_cli(["plan", "--profile", "h100-sxm-80gb", "--seq-len", "64k"], capsys)
    assert "reserved at the peak (allocator margin 10%, stated)" in stdout
