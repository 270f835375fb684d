"""Tokens/s per device and MFU at a global batch (plan/throughput.py, plan --global-batch-tokens)."""

import json

import pytest

from dattn_cli.plan import solve
from dattn_cli.plan.parallel import Training
from dattn_cli.plan.profiles import load_profile
from dattn_cli.plan.throughput import megatron_flops_per_token
from dattn_cli.workload import Problem
from dattn_cli.workload.model_presets import load_preset
from tests.cli.test_verify_env import run_cli

H100 = load_profile("h100-sxm-80gb")


def llama8b(n: int = 32768, **options) -> Problem:
    fields = {"impl": "sdpa", "target": "model", "seq_len": n, "dtype": "bfloat16", "mode": "fwdbwd", **options}
    return Problem(**{**fields, **load_preset("llama-3.1-8b")})


def test_the_global_batch_is_accumulated_and_the_optimizer_step_runs_once():
    s = llama8b(checkpointing=True)
    layout = dict(devices=16, sequence_parallel=2, zero=3, loss="chunked")
    one = solve.plan(s, H100, training=Training(**layout))
    many = solve.plan(s, H100, training=Training(**layout, global_batch_tokens=4 << 20))
    micro, optimizer = one.time.total_s, one.time.optimizer_s
    rate = many.throughput
    assert rate.accumulation == 16  # 4M tokens over 8 replicas of 32K
    assert rate.step_s == pytest.approx(16 * (micro - optimizer) + optimizer)
    assert many.tokens_per_s_per_device == pytest.approx((4 << 20) / rate.step_s / 16)
    assert one.throughput.accumulation == 1 and one.tokens_per_s_per_device == pytest.approx(32768 / 2 / micro)
    peak = H100.required_peak("bfloat16")
    assert many.mfu == pytest.approx(many.time.flops * 16 / (rate.step_s * peak))
    assert many.peak_bytes == many.memory.total


def test_megatron_flops_without_recompute_are_nemos_formula():
    """nemo/utils/flops_formulas.py llama3: h^2 x L x (12 + 12 g/n + 18 F/h + 12 s/h + 6 V/(L h)) a token."""
    s = llama8b(8192)
    h, layers, n, f, vocab = 4096, 32, 8192, 14336, 128256
    nemo = layers * h * h * (12 + 12 * 8 / 32 + 18 * f / h + 12 * n / h + 6 * vocab / (layers * h))
    assert megatron_flops_per_token(s, "none") == pytest.approx(nemo)
    # full recompute: the blocks' forward once more (4 passes of 3), the head not
    head = 6 * h * vocab
    assert megatron_flops_per_token(s.model_copy(update={"checkpointing": True}), "full") == pytest.approx(
        (nemo - head) * 4 / 3 + head
    )


def test_causal_mfu_is_below_megatrons_at_long_n():
    """Megatron's convention counts the whole N x N square (and recompute): at 128K it reads far above."""
    plan = solve.plan(
        llama8b(131072, checkpointing=True), H100, training=Training(devices=8, sequence_parallel=8, zero=3)
    )
    assert plan.mfu < plan.throughput.mfu_megatron < 2.6 * plan.mfu


def test_cli_global_batch_and_max_seq_json(capsys):
    args = ["plan", "--model", "llama-3.1-8b", "--profile", "h100-sxm-80gb", "--dtype", "bfloat16", "--devices", "8"]
    args += ["--zero", "3", "--recompute", "full", "--loss", "chunked", "--global-batch-tokens", "1M"]
    code, out, err = run_cli([*args, "--seq-len", "16k", "--json", "-"], capsys)
    data = json.loads(out)
    assert code == 0 and data["throughput"]["accumulation"] == 8 and data["mfu"] > 0 and data["peak_bytes"] > 0
    assert data["tokens_per_s_per_device"] == pytest.approx(data["throughput"]["tokens_per_s_per_device"])
    code, out, err = run_cli([*args, "--max-seq", "--json", "-"], capsys)
    data = json.loads(out)
    assert code == 0 and data["max_seq_len"] == data["problem"]["seq_len"] > 16384


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--global-batch-tokens", "lots"], "--global-batch-tokens: lots is not a token count"),
        (["--global-batch-tokens", "0"], "--global-batch-tokens: 0 is not a token count"),
    ],
)
def test_bad_global_batch_is_one_line(extra, message, capsys):
    args = ["plan", "--model", "llama-3.1-8b", "--profile", "h100-sxm-80gb", "--dtype", "bfloat16", *extra]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_megatrons_convention_is_for_dense_attention_only():
    s = Problem(impl="ImprovedMultiheadDilatedAttention", target="model", seq_len=16384, embed_dim=512, heads=8)
    plan = solve.plan(s.model_copy(update={"mode": "fwdbwd"}), H100, training=Training(devices=1))
    assert plan.mfu > 0 and plan.throughput.mfu_megatron is None and plan.throughput.megatron_flops_per_token is None
