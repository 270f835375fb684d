"""CPU offload in the planner (plan/offload.py): what leaves the device, what the host holds, the copies a step
adds, the host's capacity, and `plan --offload`'s refusals."""

import json

import pytest

from dattn_cli.plan import offload, solve
from dattn_cli.plan.parallel import Training, model_states
from dattn_cli.plan.profiles import load_profile
from dattn_cli.workload import Problem
from dattn_cli.workload.model_presets import load_preset
from tests.cli.test_verify_env import run_cli

H100 = load_profile("h100-sxm-80gb")
GiB = 2**30


def llama(seq_len: int = 65536, **overrides) -> Problem:
    fields = dict(impl="sdpa", target="model", seq_len=seq_len, dtype="bfloat16", mode="fwdbwd", checkpointing=True)
    return Problem(**{**fields, **load_preset("llama-3.1-8b"), **overrides})


def planned(s: Problem, **training):
    return solve.plan(s, H100, training=Training(**{"devices": 8, "zero": 3, **training}))


def test_parse_keeps_a_fixed_order_and_refuses_unknown_kinds():
    assert offload.parse("parameters, activations") == ("activations", "parameters")
    assert offload.parse(None) == ()
    with pytest.raises(ValueError, match="--offload 'disk' is not offloadable"):
        offload.parse("activations,disk")


def test_optimizer_offload_moves_states_and_master_copy_to_the_host():
    s = llama()
    base, moved = planned(s), planned(s, offload=("optimizer",))
    states = model_states(s, Training(devices=8, zero=3, offload=("optimizer",)))
    host = sum(states.host.values())
    assert host > 0 and not any(k.startswith(("optimizer states", "fp32 master")) for k in states.resident)
    # AdamW on bf16 weights: 8 bytes of states and 4 of master copy per parameter, 1/8 of them per device
    shard = next(v for k, v in states.resident.items() if k.startswith("parameters"))  # P x 2 / 8
    assert states.host["optimizer states (1/8 shard)"] == pytest.approx(4 * shard)
    assert states.host["fp32 master weights (1/8 shard)"] == pytest.approx(2 * shard)
    # CPU Adam reads an fp32 gradient partition on the host and updates in place: no temporary anywhere
    assert states.host[offload.HOST_GRADIENTS + " (1/8 shard)"] == pytest.approx(2 * shard)
    assert "optimizer temporary" not in states.step and len(states.host) == 3
    # with ZeRO >= 2 each reduced bucket goes to that host partition: no gradient shard stays on the device
    assert states.step == {}
    assert model_states(s, Training(devices=8, zero=1, offload=("optimizer",))).step  # ZeRO-1: whole gradients
    assert moved.memory.total < base.memory.total
    assert moved.host_bytes == pytest.approx(8 * host, rel=1e-9)
    names = [c.name for c in moved.time.collectives if c.link == "host"]
    assert names == ["gradient shard to the host", "updated weight shard to the device"]


def test_activation_offload_keeps_two_checkpoints_on_the_device():
    s = llama()
    base, moved = planned(s), planned(s, offload=("activations",))
    checkpoint = 65536 * 4096 * 2  # T x E x bf16
    assert moved.memory.phase == base.memory.phase == "loss backward (logits)"  # every block's input waiting
    assert base.memory.items["checkpointed block inputs"] == 32 * checkpoint
    assert moved.memory.items["checkpointed block inputs (others offloaded)"] == 2 * checkpoint
    assert base.memory.total - moved.memory.total == 30 * checkpoint
    assert moved.host_bytes == 8 * 32 * checkpoint
    copies = {c.name: c for c in moved.time.collectives if c.link == "host"}
    down = copies["checkpointed inputs to the host"]
    assert down.bytes == 32 * checkpoint
    # 32 copies of 128 MiB over PCIe Gen5 at 64 GB/s x the communication efficiency 0.8, plus a latency each
    assert down.seconds == pytest.approx(32 * 10e-6 + 32 * checkpoint / (64e9 * 0.8))
    assert down.exposed_s == 0.0  # hidden under a forward of seconds


def test_parameter_offload_needs_zero_3_and_moves_the_shard():
    s = llama()
    moved = planned(s, offload=("optimizer", "parameters"))
    assert not any(k.startswith("parameters") for k in moved.memory.items)
    names = [c.name for c in moved.time.collectives if c.link == "host"]
    assert "updated weight shard to the device" not in names  # updated where they live
    assert "parameter shard to the device (forward)" in names
    alone = planned(s, offload=("parameters",))  # the device's step updates them: copied back, exposed
    back = next(c for c in alone.time.collectives if c.name == "updated parameter shard to the host")
    assert back.exposed_s == back.seconds > 0


def test_host_memory_is_a_capacity_too():
    small = H100.model_copy(update={"host": H100.host.model_copy(update={"memory_gib_per_node": 8})})
    s = llama(8192)
    fits = solve.plan(s, H100, training=Training(devices=8, zero=3, offload=("optimizer",)))
    assert fits.fits  # on the device, and on a 2 TB host
    result = solve.plan(s, small, training=Training(devices=8, zero=3, offload=("optimizer",)))
    assert not result.fits and not result.feasible
    assert result.reason.startswith("does not fit: the host needs") and "has 8.0" in result.reason
    both = solve.plan(llama(1 << 20), small, training=Training(devices=8, zero=3, offload=("optimizer",)))
    assert both.reason.startswith("does not fit: needs") and "; the host needs" in both.reason  # device and host


@pytest.mark.parametrize(
    "kinds, zero, checkpointing, profile, message",
    [
        (("activations",), 3, False, H100, "add --recompute full"),
        (("optimizer",), 0, True, H100, "use --zero 1, 2 or 3"),
        (("parameters",), 2, True, H100, "ZeRO-3 only"),
        (("optimizer",), 1, True, load_profile("l4"), "has no host section"),
    ],
)
def test_preconditions_are_refused_naming_the_way_out(kinds, zero, checkpointing, profile, message):
    s = llama(checkpointing=checkpointing)
    with pytest.raises(ValueError, match=message):
        offload.check(s, Training(devices=8, zero=zero, offload=kinds), profile.host is not None, profile.name)


def test_cli_offload_json_and_bad_input(capsys):
    base = ["plan", "--model", "llama-3.1-8b", "--profile", "h100-sxm-80gb", "--seq-len", "64k", "--dtype", "bfloat16"]
    base += ["--world-size", "8", "--zero", "3", "--recompute", "full"]
    code, out, _ = run_cli([*base, "--offload", "activations,optimizer", "--json", "-"], capsys)
    assert code in (0, None)
    data = json.loads(out)
    assert data["training"]["offload"] == ["activations", "optimizer"] and data["host_bytes"] > 0
    code, out, err = run_cli([*base, "--offload", "gpu"], capsys)
    assert code == 2 and "--offload 'gpu'" in err and not out
    code, _, err = run_cli(["plan", "--seq-len", "4096", "--offload", "optimizer"], capsys)  # an attention call
    assert code == 2 and "--offload" in err, err
    code, _, err = run_cli([*base, "--offload", "optimizer", "--optimizer", "adam8bit"], capsys)
    assert code == 2 and "use --optimizer adamw or sgd" in err, err


def test_one_device_zero3_still_gathers_offloaded_parameters():
    s = llama()
    one = solve.plan(s, H100, training=Training(devices=1, zero=3, offload=("optimizer", "parameters")))
    assert not any(k.startswith("parameters") for k in one.memory.items)
    assert one.memory.items["all-gathered parameters (unit in use + prefetched)"] > 0


def test_copies_of_one_direction_share_the_pass_they_hide_under():
    s = llama()
    t = Training(devices=8, zero=3, offload=("activations", "parameters"))
    shard, window = 1e9, 0.05  # 2 x 32 copies into the device during a 50 ms backward
    copies = {c["name"]: c for c in offload.transfers(s, t, H100, shard, (1.0, window), s)}
    back = [copies["checkpointed inputs back to the device"], copies["parameter shard to the device (backward)"]]
    assert sum(c["seconds"] - c["exposed_s"] for c in back) == pytest.approx(window)  # hidden once, not twice
    assert sum(c["exposed_s"] for c in back) == pytest.approx(sum(c["seconds"] for c in back) - window)
    assert copies["checkpointed inputs to the host"]["exposed_s"] == 0.0  # the other direction: its own room
