"""plan --fp8 (plan/fp8.py): what TransformerEngine's and torchao's FP8 linears change in a decoder layer's saved set,
in FSDP's all-gathers and in the linear layers' time, each against the byte and second counts written out here."""

import json

import pytest

from dattn_cli.plan import decoder, fp8
from dattn_cli.plan.layers import linear_seconds
from dattn_cli.plan.memory import estimate_memory
from dattn_cli.plan.parallel import Training, model_states, model_time
from dattn_cli.plan.profiles import load_profile
from dattn_cli.workload import Problem
from dattn_cli.workload.architecture import Architecture, block_matmul_parameters
from dattn_cli.workload.counts import linear_flops
from tests.cli.test_verify_env import run_cli

E, H, KV, D, F, N, LAYERS, V = 512, 8, 2, 64, 1376, 2048, 4, 1000


def llama(dtype: str = "bfloat16", fp8_kind: str | None = None, target: str = "model", **options) -> Problem:
    architecture = Architecture(name="tiny llama", intermediate_size=F, fp8=fp8_kind)
    return Problem(
        impl="sdpa",
        target=target,
        architecture=architecture,
        seq_len=N,
        heads=H,
        kv_heads=KV,
        head_dim=D,
        embed_dim=E,
        layers=LAYERS,
        vocab_size=V,
        dtype=dtype,
        mode="fwdbwd",
        causal=True,
        **options,
    )


def saved(s: Problem) -> int:
    return sum(decoder.block_saved_bytes(s, estimate_memory(s.attention_problem()).items).values())


@pytest.mark.parametrize("amp", [None, "bf16"])
def test_te_saves_fp8_inputs_and_weights(amp):
    """bf16 weights: q, k, v keep three 1-byte copies of the attention norm's output for its one 2-byte tensor, gate and
    up two for one, down 1 byte for the 2-byte product, o_proj a 1-byte copy of the attention output; plus the FP8
    weights and transposes. Under autocast (fp32 weights) every linear already kept its own 2-byte copy, and the FP8
    weights replace autocast's half ones."""
    dtype = "float32" if amp else "bfloat16"
    base, te = llama(dtype, amp=amp), llama(dtype, "te", amp=amp)
    tokens, matmul = N, block_matmul_parameters(base)
    copies = 1 if amp is None else 3  # the attention norm's output, kept once (bf16) or by each of q, k, v (autocast)
    mlp_copies = 1 if amp is None else 2
    expected = (
        tokens * E * (3 - 2 * copies)
        + tokens * E * (2 - 2 * mlp_copies)
        + tokens * F * (1 - 2)
        + tokens * H * D
        + 2 * matmul
        - (2 * matmul if amp else 0)
    )
    assert saved(te) - saved(base) == expected


def test_torchao_keeps_the_saved_set_and_gathers_matmul_weights_in_one_byte():
    base, ao = llama(), llama(fp8_kind="torchao")
    assert saved(ao) == saved(base)
    t = Training(devices=8, zero=3)
    unit = "all-gathered parameters (unit in use + prefetched)"
    gathered = {s.arch.fp8: model_states(s, t).forward[unit] for s in (base, ao)}
    assert gathered[None] - gathered["torchao"] == 2 * block_matmul_parameters(base) * (2 - 1)  # two blocks
    profile = load_profile("h100-sxm-80gb")
    sent = {s.arch.fp8: {c.name: c.bytes for c in model_time(s, profile, t).collectives} for s in (base, ao)}
    fewer = 7 / 8 * LAYERS * block_matmul_parameters(base)
    assert sent[None]["FSDP all-gather (forward)"] - sent["torchao"]["FSDP all-gather (forward)"] == pytest.approx(
        fewer, abs=2
    )
    assert sent[None]["FSDP reduce-scatter of gradients"] == sent["torchao"]["FSDP reduce-scatter of gradients"]


def test_fp8_linear_time_is_the_blocks_at_the_float8_rate_the_head_at_bf16_and_the_casts():
    profile = load_profile("h100-sxm-80gb")
    s = llama(fp8_kind="te")
    flops = linear_flops(s)
    efficiency = profile.efficiency.compute_for("matmul:bfloat16", "fwdbwd")
    per_token = E * H * D * 2 + 2 * E * KV * D + 3 * E * F  # q, o; k, v; gate, up, down
    blocks = 6.0 * N * per_token * LAYERS
    head = 6.0 * N * E * V
    assert blocks + head == pytest.approx(flops)
    inputs_and_output_grads = (E + H * D) + 2 * (E + KV * D) + (H * D + E) + 2 * (E + F) + (F + E)
    casts = N * LAYERS * inputs_and_output_grads * (2 + 2) + LAYERS * per_token * (2 + 2)
    expected = blocks / (1979e12 * efficiency) + head / (989.5e12 * efficiency) + profile.memory_seconds(casts)
    assert linear_seconds(s, profile, flops) == pytest.approx(expected, rel=1e-9)
    assert linear_seconds(s, profile, flops) < linear_seconds(llama(), profile, flops)


def test_plan_fp8_from_the_cli(capsys):
    args = ["plan", "--model", "llama-3.1-8b", "--profile", "h100-sxm-80gb", "--seq-len", "8192", "--dtype", "bfloat16"]
    results = {}
    for kind in (None, "te", "torchao"):
        code, stdout, err = run_cli([*args, *(["--fp8", kind] if kind else []), "--json", "-"], capsys)
        assert code == 0, err
        results[kind] = json.loads(stdout)
    assert results["te"]["problem"]["architecture"]["fp8"] == "te"
    assert results["te"]["memory"]["total"] > results[None]["memory"]["total"]  # FP8 weight copies
    assert results["torchao"]["memory"]["total"] == results[None]["memory"]["total"]
    assert results["te"]["time"]["total_s"] < results[None]["time"]["total_s"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seq-len", "4096", "--fp8", "te"], "--fp8 te runs a named model's linears: give --model or --model-config"),
        (["--model", "llama-3.1-8b", "--seq-len", "4096", "--fp8", "te", "--dtype", "float32"], "--fp8 runs the rest"),
        (["--model", "llama-3.1-8b", "--seq-len", "4096", "--fp8", "fp4"], "--fp8"),
        (
            [
                "--model",
                "llama-3.1-8b",
                "--seq-len",
                "4096",
                "--fp8",
                "te",
                "--dtype",
                "bfloat16",
                "--profile",
                "a100-sxm-80gb",
            ],
            "no float8 rate",
        ),
        (
            ["--model", "llama-3.1-8b", "--seq-len", "4096", "--fp8", "te", "--dtype", "bfloat16", "--tiled-mlp"],
            "--fp8 with --tiled-mlp",
        ),
    ],
)
def test_bad_fp8_input_is_one_line(args, message, capsys):
    code, _, err = run_cli(["plan", *args], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in err and "Traceback" not in err, err


def test_kind_of_a_problem_without_a_named_model_is_none():
    assert fp8.kind(Problem(impl="ImprovedDilatedAttention", seq_len=4096)) is None
