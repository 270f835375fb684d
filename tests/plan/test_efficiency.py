"""The attention efficiency model (plan/efficiency.py), its use by the time model (plan/time.py) and the
per-kernel calibration on its curves (plan/check.py: calibrate)."""

import pytest

from dattn_cli.plan.check import calibrate
from dattn_cli.plan.efficiency import curve_at, curve_efficiency, saturation, wave_factor
from dattn_cli.plan.profiles import AttentionCurve, ProfileError, load_profile, parse_profile, shipped_profiles
from dattn_cli.plan.time import estimate_time, kernel_blocks, kernel_for
from dattn_cli.workload import Problem
from dattn_cli.workload.records import BenchRow, row_fields

H100 = load_profile("h100-sxm-80gb")
CPU = load_profile("cpu-host")


def dense(n: int, d: int = 128, causal: bool = False, mode: str = "fwdbwd", impl: str = "flash", **kw) -> Problem:
    """The FlashAttention papers' standard shape: 16k tokens per batch, hidden 2048."""
    return Problem(
        impl=impl,
        seq_len=n,
        batch=16384 // n,
        heads=2048 // d,
        head_dim=d,
        dtype="bfloat16",
        causal=causal,
        mode=mode,
        device="cuda",
        segment_lengths=[n],
        dilation_rates=[1],
        **kw,
    )


def published_tflops(s: Problem, profile=H100) -> float:
    """Predicted TFLOP/s in the papers' convention (4·B·H·N²·d, halved when causal, x3.5 fwd+bwd)."""
    flops = (
        4
        * s.batch
        * s.heads
        * s.seq_len**2
        * s.head_dim
        * (0.5 if s.causal else 1)
        * (3.5 if s.mode == "fwdbwd" else 1)
    )
    return flops / estimate_time(s, profile).total_s / 1e12


def test_efficiency_rises_with_n_and_causal_starts_lower():
    eff = H100.efficiency
    values = [curve_efficiency(eff, "flash", "bfloat16", 128, False, "fwdbwd", n, 1 << 20) for n in (512, 2048, 16384)]
    causal = [curve_efficiency(eff, "flash", "bfloat16", 128, True, "fwdbwd", n, 1 << 20) for n in (512, 2048, 16384)]
    assert values[0] < values[1] < values[2] < 0.4
    assert causal[0] < causal[1] < causal[2] and causal[0] < 0.75 * values[0]
    assert saturation(1e12, 0.5, 300) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "n, d, causal, mode, impl, backend, published",
    [
        (512, 128, False, "fwdbwd", "flash", "auto", 248),  # README flash2_h100_fwd_bwd_benchmark.png (b)
        (16384, 128, False, "fwdbwd", "flash", "auto", 338),
        (512, 128, True, "fwdbwd", "flash", "auto", 163),  # (d)
        (16384, 128, True, "fwdbwd", "flash", "auto", 328),
        (512, 128, False, "fwd", "flash", "flash3", 467),  # FlashAttention-3 fig. (c) in the README
        (16384, 128, True, "fwd", "flash", "flash3", 616),  # (d)
    ],
)
def test_planner_reproduces_published_h100_cells(n, d, causal, mode, impl, backend, published):
    assert published_tflops(dense(n, d, causal, mode, impl, backend=backend)) == pytest.approx(published, rel=0.08)


def test_a100_reaches_a_larger_share_of_peak_than_h100():
    a100 = load_profile("a100-sxm-80gb")
    share = {p.name: published_tflops(dense(16384), p) * 1e12 / p.peak_flops("bfloat16") for p in (a100, H100)}
    assert share["A100 SXM 80GB"] > 0.6 and share["H100 SXM 80GB"] < 0.4


def test_wave_factor_idles_the_last_wave():
    assert wave_factor(128, 132, 132) == 1.0
    assert wave_factor(128, 133, 132) == pytest.approx(133 / 264)
    assert wave_factor(128, 1, None) == 1.0


def test_head_dims_between_fitted_ones_interpolate_and_outside_take_the_nearest():
    eff = H100.efficiency
    c64, c128 = (curve_at(eff, "flash", "bfloat16", d, False, "fwdbwd") for d in (64, 128))
    c90 = curve_at(eff, "flash", "bfloat16", 90, False, "fwdbwd")
    assert min(c64.e_inf, c128.e_inf) < c90.e_inf < max(c64.e_inf, c128.e_inf) and "interpolated" in c90.source
    c32 = curve_at(eff, "flash", "bfloat16", 32, False, "fwdbwd")
    assert c32.e_inf == c64.e_inf and "nearest" in c32.source
    assert curve_at(eff, "flash", "float32", 64, False, "fwdbwd") is None  # no fp32 curve: the prior


def test_fwdbwd_from_fwd_and_bwd_curves_is_the_flop_weighted_harmonic_mean():
    curves = [
        AttentionCurve(kernel="k", direction=d, causal=False, head_dim=64, e_inf=e, n_half=0, source="test")
        for d, e in (("fwd", 0.6), ("bwd", 0.3))
    ]
    eff = H100.efficiency.model_copy(update={"attention_curves": curves, "compute_units": None})
    assert curve_efficiency(eff, "k", "float16", 64, False, "fwdbwd", 4096, 64) == pytest.approx(
        3.5 / (1 / 0.6 + 2.5 / 0.3)
    )


def test_bwd_from_fwd_and_fwdbwd_curves_inverts_that_mean():
    curves = [
        AttentionCurve(kernel="k", direction=d, causal=False, head_dim=64, e_inf=e, n_half=0, source="test")
        for d, e in (("fwd", 0.6), ("fwdbwd", 3.5 / (1 / 0.6 + 2.5 / 0.3)))
    ]
    eff = H100.efficiency.model_copy(update={"attention_curves": curves, "compute_units": None})
    assert curve_efficiency(eff, "k", "float16", 64, False, "bwd", 4096, 64) == pytest.approx(0.3)


@pytest.mark.parametrize("causal", [False, True])
def test_a_bwd_from_the_fwd_curve_pays_the_memory_bound_passes(causal):
    """14 bytes an element of B·H·N·D in bf16 at the ridge (peak / bandwidth), against 2.5 x 4·N FLOPs an element
    (half of it causal): the gap to the fwd curve shrinks as 1/N."""
    fwd = AttentionCurve(kernel="k", direction="fwd", causal=causal, head_dim=64, e_inf=0.6, n_half=0, source="t")
    eff = H100.efficiency.model_copy(update={"attention_curves": [fwd], "compute_units": None})
    ridge = H100.ridge("bfloat16")
    for n in (512, 16384):
        flops = 2.5 * 4 * n / (2 if causal else 1)
        bwd = curve_efficiency(eff, "k", "bfloat16", 64, causal, "bwd", n, 64, ridge)
        assert bwd == pytest.approx(1 / (1 / 0.6 + ridge * 14 / flops))
        both = curve_efficiency(eff, "k", "bfloat16", 64, causal, "fwdbwd", n, 64, ridge)
        assert both == pytest.approx(3.5 / (1 / 0.6 + 2.5 / bwd))
    assert curve_efficiency(eff, "k", "bfloat16", 64, causal, "bwd", 512, 64) == pytest.approx(0.6)  # no ridge given


def test_dilated_blocks_run_at_their_own_length_and_count():
    dilated = Problem(
        impl="ImprovedDilatedAttention",
        seq_len=16384,
        batch=1,
        heads=16,
        head_dim=128,
        dtype="bfloat16",
        mode="fwdbwd",
        device="cuda",
        segment_lengths=[512],
        dilation_rates=[1],
    )
    assert kernel_blocks(dilated) == [(512, 32 * 16, 32 * 16 * 512 * 512, 1, 32 * 16 * 512)]
    t = estimate_time(dilated, H100)
    assert t.kernel == "flash" and t.efficiency == pytest.approx(
        curve_efficiency(H100.efficiency, "flash", "bfloat16", 128, False, "fwdbwd", 512, 512)
    )
    long = estimate_time(dilated.model_copy(update={"segment_lengths": [8192]}), H100)
    assert long.efficiency > t.efficiency  # short segments sit low on the curve
    sparse = estimate_time(dilated.model_copy(update={"segment_lengths": [2048, 8192], "dilation_rates": [1, 4]}), H100)
    assert sparse.memory_bytes > 0 and sparse.total_s > sparse.compute_s  # gather/merge passes at memory bandwidth


def test_kernel_choice():
    assert kernel_for(dense(4096), H100) == "flash"
    assert kernel_for(dense(4096, impl="sdpa"), H100) == "sdpa"
    assert kernel_for(dense(4096, backend="flash3"), H100) == "flash3"
    dilated = Problem(impl="ImprovedDilatedAttention", dtype="bfloat16", device="cuda")
    assert (
        kernel_for(dilated, H100) == "flash"
        and kernel_for(dilated.model_copy(update={"dtype": "float32"}), H100) == "sdpa"
    )


def test_without_curves_the_prior_and_no_traffic_cpu_unchanged():
    s = Problem(impl="ImprovedDilatedAttention", seq_len=8192)
    t = estimate_time(s, CPU)
    assert t.kernel is None and t.memory_bytes == 0
    assert t.compute_s == pytest.approx(t.flops / (CPU.peak_flops("float32") * CPU.efficiency.attention_compute))
    fp32 = estimate_time(dense(4096).model_copy(update={"dtype": "float32"}), H100)  # no fp32 curve on the H100
    assert fp32.kernel is None and fp32.efficiency == H100.efficiency.attention_compute


def _row(s: Problem, ms: float) -> BenchRow:
    return BenchRow(**row_fields(s), status="ok", time_ms=ms)


def test_calibrate_fits_a_kernel_scale_on_the_curve_from_gpu_rows():
    rows = []
    for n in (512, 2048, 8192, 16384):  # a GPU 20% slower than the curve at every N
        s = dense(n)
        rows.append(_row(s, estimate_time(s, H100).total_s * 1e3 * 1.25))
    calibrated = calibrate(rows, H100, "gpu.jsonl")
    assert calibrated.efficiency.kernel_scale == {"flash/fwdbwd": pytest.approx(0.8)}
    assert calibrated.efficiency.per_impl == {}
    for row in rows:
        assert estimate_time(dense(row.seq_len), calibrated).total_s * 1e3 == pytest.approx(row.time_ms, rel=1e-6)


def test_calibrate_keeps_cpu_rows_on_per_implementation_efficiency():
    s = Problem(impl="sdpa", seq_len=1024, segment_lengths=[1024], dilation_rates=[1])
    calibrated = calibrate([_row(s, 100.0)], CPU, "cpu.jsonl")
    assert calibrated.efficiency.kernel_scale == {} and set(calibrated.efficiency.per_impl) == {"sdpa/fwd"}


BAD_CURVE = {
    "e_inf: 0.": ("e_inf: 1.5", "attention_curves.0.e_inf"),
    "causal: false": ('causal: "false"', "attention_curves.0.causal"),
    "direction: fwdbwd": ("direction: sideways", "attention_curves.0.direction"),
}


@pytest.mark.parametrize("needle", list(BAD_CURVE))
def test_a_bad_curve_is_refused_naming_the_field(needle):
    text = shipped_profiles()["a100-sxm-80gb"].read_text()
    at = text.index(needle)
    bad, field = BAD_CURVE[needle]
    line_end = text.index(",", at)
    with pytest.raises(ProfileError, match=field.replace(".", r"\.")):
        parse_profile(text[:at] + bad + text[line_end:], "mine.yaml")


def test_every_curve_names_its_source():
    for name in shipped_profiles():
        for curve in load_profile(name).efficiency.attention_curves:
            assert curve.source.strip()


def test_plan_kernel_option_picks_the_curve_and_a_bad_one_is_one_line(capsys):
    from tests.cli.test_verify_env import run_cli

    args = [
        "plan",
        "--impl",
        "flash",
        "--profile",
        "h100-sxm-80gb",
        "--dtype",
        "bfloat16",
        "--seq-len",
        "16k",
        "--heads",
        "16",
        "--head-dim",
        "128",
        "--mode",
        "fwd",
    ]
    code, out, err = run_cli([*args, "--kernel", "flash3"], capsys)
    assert code == 0, err
    assert "flash3 kernel" in out and "attention efficiency" in out
    code, out, _ = run_cli(args, capsys)
    assert code == 0 and "flash kernel" in out
    code, _, err = run_cli([*args, "--kernel", "flash4"], capsys)
    assert code == 2 and "--kernel" in err and len(err.strip().splitlines()) == 1


def test_missing_curves_borrow_a_stated_one():
    a100 = load_profile("a100-sxm-80gb")  # sm80: SDPA's flash backend, FlashAttention-2
    sdpa = estimate_time(dense(4096, impl="sdpa"), a100)
    assert (
        sdpa.efficiency == estimate_time(dense(4096), a100).efficiency and "FlashAttention-2" in sdpa.efficiency_source
    )
    hopper = estimate_time(dense(4096, impl="sdpa", mode="fwd"), H100)  # torch >= 2.11 prefers cuDNN on sm90
    cudnn = estimate_time(dense(4096, mode="fwd", backend="cudnn"), H100)
    assert hopper.efficiency == cudnn.efficiency and "check_prefer_cudnn_attention" in hopper.efficiency_source
    fa3 = estimate_time(dense(4096, backend="flash3"), H100)  # FA3 has forward curves only here
    assert fa3.kernel == "flash3" and "the bwd's memory-bound passes added" in fa3.efficiency_source
    flex = estimate_time(dense(4096, backend="flex"), H100)  # no flex curves: FlashAttention-2's
    assert flex.efficiency == estimate_time(dense(4096), H100).efficiency and "FlexAttention" in flex.efficiency_source
    causal_only = H100.efficiency.model_copy(
        update={"attention_curves": [c for c in H100.efficiency.attention_curves if not c.causal]}
    )
    lone = H100.model_copy(update={"efficiency": causal_only})
    assert estimate_time(dense(4096, causal=True), lone).kernel is None  # never across causal: the prior


def test_block_sparse_runs_at_the_keys_each_query_row_attends():
    s = Problem(
        impl="BlockSparseRingDilatedAttention",
        seq_len=16384,
        heads=8,
        head_dim=64,
        dtype="bfloat16",
        device="cuda",
        pattern="local",
        window=2,
    )
    [(keys, in_flight, _, _, rows)] = kernel_blocks(s)
    assert rows == 8 * 16384 and keys * rows == pytest.approx(s.spec.pairs(s), rel=1e-3)
    flex = AttentionCurve(kernel="flex", direction="fwd", causal=False, head_dim=64, e_inf=0.5, n_half=500, source="t")
    eff = H100.efficiency.model_copy(update={"attention_curves": [flex], "compute_units": None})
    t = estimate_time(s, H100.model_copy(update={"efficiency": eff}))
    assert t.kernel == "flex" and t.efficiency == pytest.approx(0.5 * keys / (keys + 500))
