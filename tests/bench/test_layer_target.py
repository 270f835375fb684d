"""`dattn bench --target layer|model`: a block and a LongNetLM training step measured through the same
sweep, with checkpointing and autocast options, and their configuration checks."""

import pytest

from dattn_cli.bench import Sweep, run_sweep
from dattn_cli.bench.point import measure_point
from dattn_cli.plan import predicted_peak_bytes
from dattn_cli.plan.layers import model_parameters
from dattn_cli.workload import Problem

TINY = dict(
    impls=["ImprovedMultiheadDilatedAttention"],
    seq_lens=[256],
    heads=2,
    embed_dim=32,
    segment_lengths=[64, 128],
    dilation_rates=[1, 2],
    mode="fwdbwd",
    warmup=1,
    repeat=1,
    max_memory=2**31,
)


@pytest.mark.parametrize(
    "target,options",
    [
        ("layer", {}),
        ("layer", {"checkpointing": True}),
        ("layer", {"amp": "bf16"}),
        ("model", {"layers": 2, "vocab_size": 64}),
        ("model", {"layers": 2, "vocab_size": 64, "checkpointing": True}),
    ],
)
def test_layer_and_model_points_are_measured(target, options):
    cfg = Sweep(**TINY, target=target, **options)
    result = measure_point(cfg, cfg.point(cfg.impls[0], 256))
    assert result["status"] == "ok" and result["time_ms"] > 0 and result["params"] > 0
    assert result["flops"] > 0


@pytest.mark.slow
def test_rows_carry_the_layer_fields():
    cfg = Sweep(**TINY, target="model", layers=2, vocab_size=64, checkpointing=True)
    row = run_sweep(cfg, predict=predicted_peak_bytes).rows[0]
    assert row.status == "ok", row.error
    assert (row.target, row.embed_dim, row.layers, row.checkpointing, row.head_dim) == ("model", 32, 2, True, 16)
    # the planner's parameter count (blocks, tied embedding, final LayerNorm) is the module's
    assert row.predicted_mem_bytes and row.params == model_parameters(
        Problem(impl=row.impl, target="model", layers=2, vocab_size=64, heads=2, head_dim=16)
    )


def test_layer_around_a_block_sparse_attention():
    cfg = Sweep(
        **{**TINY, "impls": ["BlockSparseRingMultiheadDilatedAttention"]},
        target="layer",
        pattern="local",
        block_size=32,
        window=1,
    )
    result = measure_point(cfg, cfg.point(cfg.impls[0], 256))
    assert result["status"] == "ok", result


@pytest.mark.parametrize(
    "options,message",
    [
        ({"target": "layer", "impls": ["ImprovedDilatedAttention"]}, "not one: use"),
        ({"target": "layer", "impls": ["sdpa"]}, "not one: use"),
        ({"target": "layer", "embed_dim": 33}, "not divisible by --heads"),
        ({"target": "layer", "embed_dim": 34}, "must be even"),
        ({"checkpointing": True}, "apply to --target layer or model"),
        ({"target": "layer", "amp": "fp8"}, "amp"),
    ],
)
def test_bad_layer_options(options, message):
    with pytest.raises(ValueError, match=message):
        Sweep(**{**TINY, **options})
