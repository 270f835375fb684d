"""The layer/model memory model against what torch allocates, its phases, and plan --target layer|model."""

import json

import pytest
import torch

from dattn_cli.kernels import reset_global_memory_pool
from dattn_cli.plan import check, solve
from dattn_cli.plan.layers import ModelStates, bench_states, layer_memory
from dattn_cli.plan.profiles import load_profile
from dattn_cli.runtime.measure import LiveTensorBytes
from dattn_cli.workload import Problem
from dattn_cli.workload.architecture import block_parameters_of
from dattn_cli.workload.build import build_call
from dattn_cli.workload.records import BenchRow
from tests.cli.test_verify_env import run_cli

IMPL = "ImprovedMultiheadDilatedAttention"


def live_peak(problem: Problem) -> int:
    """Peak live tensor bytes of two bench steps, module, optimizer state and inputs included."""
    reset_global_memory_pool()
    torch.manual_seed(0)
    out = None
    with LiveTensorBytes() as tracker:
        call = build_call(problem)
        for _ in range(2):
            inputs = call.make_inputs()
            if problem.mode == "fwd":
                with torch.no_grad():
                    call.run(*inputs)
            else:
                out = call.run(*inputs)
                if out is not None:
                    out.backward(torch.ones_like(out))
            inputs = out = None
    return tracker.peak


CASES = [
    dict(target="layer"),
    dict(target="layer", amp="bf16"),
    dict(target="layer", checkpointing=True),
    dict(target="layer", mode="fwd"),
    dict(target="model", layers=2, vocab_size=2048),
    dict(target="model", layers=2, vocab_size=2048, amp="bf16", checkpointing=True),
    dict(target="model", layers=3, vocab_size=256, checkpointing=True),  # peaks in a recomputed block
    dict(target="model", layers=2, vocab_size=2048, mode="fwd"),
    dict(target="layer", kv_heads=1),  # MQA: k, v, rotated k at one head's width
    dict(target="model", layers=2, vocab_size=2048, kv_heads=1, amp="bf16"),
]


@pytest.mark.slow
@pytest.mark.parametrize("options", CASES, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_tensor_items_match_live_tensor_bytes(options):
    n = 1024
    problem = Problem(
        impl=IMPL,
        seq_len=n,
        heads=2,
        head_dim=64,
        causal=True,
        segment_lengths=[256, 512],
        dilation_rates=[1, 2],
        **{"mode": "fwdbwd", **options},
    )
    predicted = layer_memory(problem, 0, "cpu")  # the tensors: the CPU runtime and kernel workspace left out
    extras = sum(v for name, v in predicted.items.items() if name.startswith("CPU runtime") or "workspace" in name)
    measured = live_peak(problem)
    assert abs(predicted.total - extras - measured) <= 0.10 * measured, (predicted.phase, predicted.items, measured)


def shape(**overrides) -> Problem:
    fields = dict(
        impl=IMPL,
        seq_len=8192,
        heads=4,
        embed_dim=256,
        segment_lengths=[2048, 4096],
        dilation_rates=[1, 2],
        mode="fwdbwd",
        target="model",
        layers=4,
        vocab_size=50304,
    )
    return Problem(**{**fields, **overrides})


def test_the_loss_dominates_a_long_sequence_with_a_large_vocabulary():
    memory = layer_memory(shape(), 0, "cuda")
    assert memory.phase == "loss backward (logits)"
    assert memory.items["log-softmax, its gradient, the logits' gradient (fp32)"] == 12 * 8192 * 50304
    assert memory.total == sum(memory.items.values())


def test_checkpointing_and_autocast_shrink_what_is_saved():
    plain = layer_memory(shape(target="layer", vocab_size=256), 0, "cuda")
    assert plain.items["saved for backward (this block)"] > 0
    deep = dict(layers=8, vocab_size=256)
    full, checkpointed = (layer_memory(shape(**deep, checkpointing=c), 0, "cuda") for c in (False, True))
    assert checkpointed.total < 0.5 * full.total
    assert checkpointed.items["checkpointed block inputs"] == 8 * 8192 * 256 * 4
    half = layer_memory(shape(**deep, amp="bf16"), 0, "cuda")
    assert half.total < full.total


def test_model_states_enter_their_phases():
    s = shape(vocab_size=256, layers=2)
    assert layer_memory(s, 0, "cuda", bench_states(s)) == layer_memory(s, 0, "cuda")  # the default is a bench's
    extra = ModelStates(
        {"resident": 10**9},
        step={"in the step": 10**10},
        backward={"in a block's backward": 10**9},
        forward={"gathered": 10**9},
        step_name="the step",
    )
    memory = layer_memory(s, 0, "cuda", extra)
    assert memory.phase == "the step" and memory.items["in the step"] == 10**10 and "gathered" not in memory.items
    gathered = layer_memory(s, 0, "cuda", ModelStates({}, forward={"gathered": 10**9}))
    assert gathered.items["gathered"] == 10**9 and "weights" not in gathered.items  # forward/backward phases carry it


def test_parameters_match_the_module():
    from dattn_cli.models.longnet import DilatedTransformerBlock

    block = DilatedTransformerBlock(96, 4, segment_lengths=[64], dilation_rates=[1], mlp_ratio=2.0)
    layer = dict(target="layer", impl="ImprovedMultiheadDilatedAttention", embed_dim=96, heads=4, mlp_ratio=2.0)
    assert sum(p.numel() for p in block.parameters()) == block_parameters_of(Problem(**layer))
    gqa = DilatedTransformerBlock(96, 4, segment_lengths=[64], dilation_rates=[1], mlp_ratio=2.0, num_kv_heads=2)
    assert sum(p.numel() for p in gqa.parameters()) == block_parameters_of(Problem(**layer, kv_heads=2))


def test_plan_solves_longest_trainable_sequence_and_checkpointing_extends_it():
    profile = load_profile("h100-sxm-80gb")
    base = shape(embed_dim=768, heads=12, layers=12, segment_lengths=[2048, 4096, 8192], dilation_rates=[1, 2, 4])
    lengths = {}
    for ckpt in (False, True):
        n, result = solve.max_seq(base.with_(checkpointing=ckpt), profile)
        assert result is not None and result.fits and result.problem.target == "model"
        assert not solve.plan(base.with_(checkpointing=ckpt, seq_len=n + 4096), profile).fits
        lengths[ckpt] = n
    assert lengths[True] > lengths[False]


def test_layer_problems_refuse_what_cannot_be_built():
    fields = dict(
        seq_len=1024,
        heads=4,
        head_dim=64,
        segment_lengths=[256],
        dilation_rates=[1],
        mode="fwdbwd",
        target="layer",
        layers=2,
        vocab_size=100,
    )
    with pytest.raises(ValueError, match="multihead"):
        Problem(**{**fields, "impl": "ImprovedDilatedAttention"})
    with pytest.raises(ValueError, match="must be even"):
        Problem(**{**fields, "impl": IMPL, "embed_dim": 12})
    with pytest.raises(ValueError, match="one device"):
        Problem(**{**fields, "impl": IMPL, "target": "model", "world_size": 2})
    assert Problem(**{**fields, "impl": IMPL, "target": "model"}).causal  # a language model is causal


def layer_row(**overrides) -> BenchRow:
    fields = dict(
        impl=IMPL,
        semantics="longnet",
        dtype="float32",
        device="cpu",
        batch=1,
        heads=4,
        head_dim=64,
        seq_len=4096,
        segments=[1024, 2048],
        dilations=[1, 2],
        causal=True,
        mode="fwdbwd",
        status="ok",
        target="layer",
        embed_dim=256,
        layers=1,
        time_ms=400.0,
        peak_mem_bytes=200 * 2**20,
    )
    return BenchRow(**{**fields, **overrides})


def test_check_and_calibrate_read_layer_rows():
    rows = [layer_row(), layer_row(target="model", layers=2, vocab_size=1000, amp="bf16", time_ms=900.0)]
    frame = check.check_rows(rows, load_profile("cpu-host"))
    assert list(frame["target"]) == ["layer", "model x2 (bf16)"]
    assert all(v is not None for v in frame["mem_error_pct"])
    calibrated = check.calibrate(rows, load_profile("cpu-host"), "rows")
    assert {"matmul:float32/fwdbwd", "matmul:bfloat16/fwdbwd"} <= set(calibrated.efficiency.per_impl)
    again = check.check_rows(rows[:1], calibrated)
    assert abs(again["time_error_pct"][0]) < 1e-6  # one row fitted: predicted time equals measured


def test_plan_cli_target_model(tmp_path, capsys):
    out = tmp_path / "p.json"
    code, stdout, err = run_cli(
        [
            "plan",
            "--target",
            "model",
            "--embed-dim",
            "768",
            "--heads",
            "12",
            "--layers",
            "12",
            "--seq-len",
            "32k",
            "--profile",
            "h100-sxm-80gb",
            "--checkpointing",
            "--amp",
            "bf16",
            "--json",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    assert "LongNetLM 12 x DilatedTransformerBlock" in stdout and "time per training step" in stdout
    data = json.loads(out.read_text())
    assert data["problem"]["target"] == "model" and data["memory"]["phase"]
    code, stdout, _ = run_cli(
        ["plan", "--target", "layer", "--seq-len", "16k", "--max-seq", "--max-memory", "1GiB"], capsys
    )
    assert code == 0 and "largest N that fits" in stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "layer", "--impl", "ImprovedDilatedAttention"], "multihead"),
        (["--target", "layer", "--min-devices"], "--min-devices applies to --target attention"),
        (["--target", "layer", "--amp", "fp8"], "--amp"),
        (["--amp", "bf16"], "apply to --target layer or model"),
        (["--target", "layer", "--world-size", "2"], "one device"),
    ],
)
def test_plan_cli_target_errors_are_one_line(args, message, capsys):
    code, _, err = run_cli(["plan", *args], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
