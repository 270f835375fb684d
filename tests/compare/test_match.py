"""dattn_cli.compare on report files: points matched by configuration, two implementations of one run,
environment differences named in warnings, the summary rule for reports without samples, exit codes and
bad input. Synthetic reports with fixed seeds; nothing is measured."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dattn_cli.compare import compare_impls, compare_reports, compare_rows
from dattn_cli.workload.records import BenchRow

ENV = {
    "record": "environment",
    "cpu": "Test CPU",
    "cpu_count": 2,
    "torch_version": "2.13.0",
    "cuda_version": None,
    "nvidia_devices": [],
    "platform": "Linux",
    "config": {"threads": 1},
}


def samples(seed: int, scale: float = 1.0, n: int = 15, ms: float = 10.0) -> list[float]:
    rng = np.random.default_rng(seed)
    times = rng.lognormal(math.log(ms), 0.03, n)
    hit = rng.random(n) < 0.10
    times[hit] *= rng.uniform(2.0, 50.0, hit.sum())
    return [float(t) for t in times * scale]


def row(impl: str = "sdpa", n: int = 256, times: list[float] | None = None, status: str = "ok", **extra) -> dict:
    fields = dict(
        impl=impl,
        semantics="longnet",
        dtype="float32",
        device="cpu",
        batch=1,
        heads=2,
        head_dim=16,
        seq_len=n,
        segments=[64, 128],
        dilations=[1, 2],
        causal=False,
        mode="fwd",
        status=status,
    )
    if times is not None:
        ordered = sorted(times)
        fields.update(
            time_ms=float(np.median(times)),
            time_ms_p10=float(np.quantile(ordered, 0.1)),
            time_ms_p90=float(np.quantile(ordered, 0.9)),
            repeats=len(times),
            samples_ms=times,
        )
    return {"record": "point", **fields, **extra}


def report(path: Path, rows: list[dict], env: dict | None = ENV) -> Path:
    lines = ([env] if env else []) + rows
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def pair(tmp_path: Path, new_scale: float = 1.0, base_env=ENV, new_env=ENV) -> tuple[Path, Path]:
    """BASE and NEW reports of the same three points; NEW's sdpa times scaled by new_scale."""
    base = report(
        tmp_path / "base.jsonl",
        [
            row("sdpa", 256, samples(1)),
            row("sdpa", 512, samples(2, ms=30)),
            row("ImprovedDilatedAttention", 256, samples(3, ms=5)),
        ],
        base_env,
    )
    new = report(
        tmp_path / "new.jsonl",
        [
            row("ImprovedDilatedAttention", 256, samples(13, ms=5)),
            row("sdpa", 512, samples(12, new_scale, ms=30)),
            row("sdpa", 256, samples(11, new_scale)),
        ],
        new_env,
    )
    return base, new


def test_identical_runs_match_by_configuration_and_are_the_same(tmp_path):
    result = compare_reports(*pair(tmp_path), threshold_pct=10)
    assert [(p.impl, p.seq_len) for p in result.points] == [
        ("ImprovedDilatedAttention", 256),
        ("sdpa", 512),
        ("sdpa", 256),
    ]
    assert {p.verdict for p in result.points} == {"same"}
    assert result.verdict == "same" and result.exit_code() == 0 and result.warnings == []
    point = result.points[1]
    assert point.n_base == point.n_new == 15 and 0.9 < point.ratio < 1.1 and point.ci_low < 1 < point.ci_high
    assert point.p_value > 0.05 and point.base_ms == pytest.approx(30, rel=0.1)


def test_a_regression_is_exit_1(tmp_path):
    result = compare_reports(*pair(tmp_path, new_scale=1.4), threshold_pct=10)
    slower = [p for p in result.points if p.impl == "sdpa"]
    assert all(p.verdict == "slower" and p.ci_low > 1.1 and 1.3 < p.ratio < 1.5 for p in slower)
    assert result.verdict == "slower" and result.exit_code() == 1


def test_a_speedup_is_exit_0(tmp_path):
    result = compare_reports(*pair(tmp_path, new_scale=0.6), threshold_pct=10)
    assert result.verdict == "faster" and result.exit_code() == 0


def test_unmatched_and_repeated_points_are_named(tmp_path):
    base = report(tmp_path / "b.jsonl", [row("sdpa", 256, samples(1)), row("sdpa", 1024, samples(2))])
    new = report(
        tmp_path / "n.jsonl", [row("sdpa", 256, samples(3)), row("sdpa", 256, samples(4)), row("math", 256, samples(5))]
    )
    result = compare_reports(base, new, threshold_pct=10)
    assert len(result.points) == 1 and result.comparable
    text = "\n".join(result.warnings)
    assert "NEW measures 1 point(s) more than once" in text and "n.jsonl:3" in text
    assert "1 point(s) of BASE have no match in NEW: sdpa N=1,024 fwd" in text
    assert "1 point(s) of NEW have no match in BASE: math N=256 fwd" in text


def test_other_configurations_do_not_match(tmp_path):
    base = report(tmp_path / "b.jsonl", [row("sdpa", 256, samples(1))])
    new = report(
        tmp_path / "n.jsonl", [row("sdpa", 256, samples(1), causal=True), row("sdpa", 256, samples(1), mode="fwdbwd")]
    )
    with pytest.raises(ValueError, match="no point of NEW matches a point of BASE"):
        compare_reports(base, new)


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("torch_version", "2.4.0", "torch differs: BASE 2.13.0, NEW 2.4.0"),
        ("hostname", "other-host", None),  # only NEW records a host: not a difference
        ("cpu", "Other CPU", "CPU differs: BASE Test CPU, NEW Other CPU"),
        ("nvidia_devices", [{"name": "NVIDIA H100"}], "GPU differs"),
        ("config", {"threads": 2}, "torch threads differ"),
        (
            "load_average",
            {"start": [3.5, 1.0, 0.5], "end": [2.0, 1.0, 0.5]},
            "load average differs: BASE up to 0.00, NEW up to 3.50",
        ),
    ],
)
def test_environment_differences_are_named_and_inconclusive(tmp_path, field, value, named):
    base_env = {**ENV, "load_average": {"start": [0.0, 0.0, 0.0], "end": [0.0, 0.0, 0.0]}}
    new_env = {**base_env, field: value}
    result = compare_reports(*pair(tmp_path, 1.4, base_env, new_env), threshold_pct=10)
    if named is None:
        assert result.comparable and result.verdict == "slower"
        return
    assert not result.comparable and result.verdict == "inconclusive" and result.exit_code() == 3
    assert any(named in w for w in result.warnings), result.warnings
    assert any("look slower" in w and "environments differ" in w for w in result.warnings)


def test_hosts_and_small_load_differences(tmp_path):
    base_env, new_env = {**ENV, "host": "a", "load_avg": [0.5, 0.4, 0.3]}, {**ENV, "host": "b", "load_avg": [1.2, 1, 1]}
    result = compare_reports(*pair(tmp_path, 1.0, base_env, new_env), threshold_pct=10)
    assert result.warnings == [
        "host differs: BASE a, NEW b"
    ]  # 0.7 more runnable processes: not a clear load difference
    resumed = report(tmp_path / "r.jsonl", [row("sdpa", 256, samples(1))], ENV)
    with resumed.open("a") as f:
        f.write(json.dumps({**ENV, "torch_version": "2.4.0"}) + "\n" + json.dumps(row("sdpa", 512, samples(2))) + "\n")
    result = compare_reports(resumed, tmp_path / "new.jsonl", threshold_pct=10)
    assert "torch changes within a run: BASE 2.13.0, 2.4.0; NEW 2.13.0" in result.warnings


def test_rows_with_other_thread_counts(tmp_path):
    base = report(tmp_path / "b.jsonl", [row("sdpa", 256, samples(1), threads=2)], env=None)
    new = report(tmp_path / "n.jsonl", [row("sdpa", 256, samples(2), threads=1)], env=None)
    result = compare_reports(base, new, threshold_pct=10)
    assert "torch threads differ: BASE 2, NEW 1" in result.warnings and result.exit_code() == 3
    assert any("BASE has no environment record" in w for w in result.warnings)


def test_threads_on_every_cpu_make_runs_incomparable_but_not_implementations_of_one_run(tmp_path):
    every = {**ENV, "torch_threads": 2, "cpu_affinity": [0, 1]}
    result = compare_reports(*pair(tmp_path, 1.4, every, every), threshold_pct=10)
    assert result.exit_code() == 3 and result.verdict == "inconclusive"
    assert any(w.startswith("BASE ran 2 torch threads on all 2 CPUs") for w in result.warnings), result.warnings
    ranks = {**ENV, "torch_threads": 2, "cpu_count": 4, "config": {"threads": 2, "world_size": 2}}
    result = compare_reports(*pair(tmp_path, 1.4, ENV, ranks), threshold_pct=10)
    assert any(w.startswith("NEW ran 2 torch threads x 2 ranks on all 4 CPUs") for w in result.warnings)
    one_thread = {**ENV, "torch_threads": 1, "cpu_count": 2, "config": {"world_size": 2}}  # 1-thread ranks: not it
    assert compare_reports(*pair(tmp_path, 1.4, one_thread, one_thread), threshold_pct=10).exit_code() == 1
    run = report(tmp_path / "run.jsonl", [row("sdpa", 256, samples(1)), row("math", 256, samples(2, 1.4))], every)
    assert compare_impls(run, "math", "sdpa", threshold_pct=10).exit_code() == 1


def test_two_implementations_of_one_run(tmp_path):
    run = report(
        tmp_path / "run.jsonl",
        [
            row("sdpa", 256, samples(1)),
            row("ImprovedDilatedAttention", 256, samples(2, 0.5)),
            row("sdpa", 512, samples(3, ms=40)),
            row("ImprovedDilatedAttention", 512, samples(4, 0.5, ms=40)),
        ],
    )
    result = compare_impls(run, "ImprovedDilatedAttention", "sdpa", threshold_pct=10)
    assert [(p.impl, p.impl_base, p.seq_len, p.verdict) for p in result.points] == [
        ("ImprovedDilatedAttention", "sdpa", 256, "faster"),
        ("ImprovedDilatedAttention", "sdpa", 512, "faster"),
    ]
    assert all(0.4 < p.ratio < 0.6 for p in result.points) and result.exit_code() == 0
    assert compare_impls(run, "sdpa", "ImprovedDilatedAttention", threshold_pct=10).exit_code() == 1
    with pytest.raises(ValueError, match="--a math: the report has no point of it; it holds Improved"):
        compare_impls(run, "math", "sdpa")
    with pytest.raises(ValueError, match="--a and --b both name sdpa"):
        compare_impls(run, "sdpa", "sdpa")


def test_reports_without_samples_use_the_summary_rule(tmp_path):
    def old(times):
        fields = row("sdpa", 256, times)
        del fields["samples_ms"]
        return fields

    base = report(tmp_path / "b.jsonl", [old([10.0, 10.5, 11.0])])
    for times, expected in (
        ([10.2, 10.6, 11.1], "inconclusive"),
        ([14.0, 14.5, 15.0], "inconclusive"),
        ([30.0, 31.0, 32.0], "slower"),
        ([4.0, 4.2, 4.4], "faster"),
        ([5.0, 30.0], "inconclusive"),
    ):
        new = report(tmp_path / "n.jsonl", [old(times)])
        point = compare_reports(base, new, threshold_pct=10).points[0]
        assert point.verdict == expected, times
        assert point.p_value is None and point.ci_low is None and "no samples_ms" in point.note


def test_failed_and_noisy_points_are_inconclusive(tmp_path):
    base = report(
        tmp_path / "b.jsonl",
        [row("sdpa", 256, samples(1)), row("sdpa", 512, samples(2)), row("sdpa", 1024, status="oom", reason="memory")],
    )
    new = report(
        tmp_path / "n.jsonl",
        [
            row("sdpa", 256, status="error", error="boom"),
            row("sdpa", 512, samples(3), noisy=True, contended=True, noisy_reason="other processes used 80% CPU"),
            row("sdpa", 1024, status="oom", reason="memory"),
        ],
    )
    result = compare_reports(base, new, threshold_pct=10)
    assert [(p.seq_len, p.verdict) for p in result.points] == [(256, "inconclusive"), (512, "inconclusive")]
    assert result.points[0].note == "NEW error (boom): not compared"
    assert "NEW flagged noisy: other processes used 80% CPU" in result.points[1].note
    assert result.exit_code() == 3


def test_bench_baseline_against_rows_in_memory(tmp_path):
    base, _ = pair(tmp_path)
    rows = [
        BenchRow.model_validate(row("sdpa", 256, samples(23, 1.5))),
        BenchRow.model_validate(row("sdpa", 512, samples(22, ms=30))),
    ]
    result = compare_rows(base, rows, threshold_pct=10, environment=ENV)
    assert [(p.seq_len, p.verdict) for p in result.points] == [(256, "slower"), (512, "same")]
    assert result.exit_code() == 1
    other = compare_rows(base, rows, threshold_pct=10, environment={**ENV, "torch_version": "2.5.0"})
    assert other.exit_code() == 3


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "base.jsonl:2: not valid JSON"),
        (
            json.dumps(row("sdpa", 256, [1.0, 2.0]) | {"samples_ms": [1.0, -1.0]}),
            "base.jsonl:2: samples_ms must hold positive, finite times",
        ),
        (
            json.dumps(row("sdpa", 256, [1.0, 2.0]) | {"samples_ms": "fast"}),
            "base.jsonl:2: not a dattn bench row (samples_ms",
        ),
        (
            json.dumps(row("sdpa", 256, [1.0, 2.0]) | {"samples_ms": [1.0, "x"]}),
            "base.jsonl:2: not a dattn bench row (samples_ms.1",
        ),
        (json.dumps({"record": "point", "impl": "sdpa"}), "base.jsonl:2: not a dattn bench row"),
    ],
)
def test_bad_reports_are_value_errors(tmp_path, line, message):
    base = tmp_path / "base.jsonl"
    base.write_text(json.dumps(ENV) + "\n" + line + "\n")
    (tmp_path / "good").mkdir()
    _, new = pair(tmp_path / "good")
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        compare_reports(base, new)


def test_missing_empty_and_bad_arguments(tmp_path):
    base, new = pair(tmp_path)
    with pytest.raises(ValueError, match="BASE .*nothing.jsonl: no such file"):
        compare_reports(tmp_path / "nothing.jsonl", new)
    with pytest.raises(ValueError, match="NEW .*holds no point rows"):
        compare_reports(base, report(tmp_path / "empty.jsonl", []))
    with pytest.raises(ValueError, match="--threshold must be a finite percentage >= 0, got -5"):
        compare_reports(base, new, threshold_pct=-5)
    with pytest.raises(ValueError, match="alpha"):
        compare_reports(base, new, alpha=1.5)


def test_many_points_keep_alpha_as_a_whole():
    """40 A/A points at threshold 0: some raw p-values fall below 0.05, none is called a change (Holm)."""
    from dattn_cli.compare.match import side_of
    from dattn_cli.compare.report import compare_pairs

    pairs = [
        (
            side_of(BenchRow.model_validate(row("sdpa", 256 * (i + 1), samples(100 + i))), "b"),
            side_of(BenchRow.model_validate(row("sdpa", 256 * (i + 1), samples(200 + i))), "n"),
        )
        for i in range(40)
    ]
    points = compare_pairs(pairs, threshold_pct=0)
    assert sum(p.p_value < 0.05 for p in points) >= 1
    assert {p.verdict for p in points} == {"same"}


def test_a_noisy_flag_on_an_old_row_makes_a_huge_change_inconclusive(tmp_path):
    def old(times, **extra):
        fields = row("sdpa", 256, times, **extra)
        del fields["samples_ms"]
        return fields

    base = report(tmp_path / "b.jsonl", [old([10.0, 10.5, 11.0])])
    new = report(tmp_path / "n.jsonl", [old([30.0, 31.0, 32.0], noisy=True, noisy_reason="load average 3.2 on 2 CPUs")])
    point = compare_reports(base, new, threshold_pct=10).points[0]
    assert point.verdict == "inconclusive" and "NEW flagged noisy: load average 3.2 on 2 CPUs" in point.note


def test_load_that_came_during_a_run_is_seen_from_its_end_record(tmp_path):
    """Quiet at the start of both runs, loaded at the end of NEW's: the run_end record bench writes carries it."""
    base, new = pair(tmp_path, 1.0, {**ENV, "load_average": [0.1, 0.1, 0.1]}, {**ENV, "load_average": [0.1, 0.1, 0.1]})
    assert compare_reports(base, new, threshold_pct=10).comparable
    with new.open("a") as f:
        f.write(json.dumps({"record": "run_end", "load_average": [2.5, 1.0, 0.4]}) + "\n")
    result = compare_reports(base, new, threshold_pct=10)
    assert not result.comparable and result.exit_code() == 3
    assert any("load" in w and "2.5" in w for w in result.warnings), result.warnings


def test_spread_alone_does_not_make_a_point_inconclusive(tmp_path):
    """A row the bench called noisy for its IQR only: the CI of the ratio already carries the spread."""
    spread = {"noisy": True, "noisy_reason": "relative IQR 29% of the median, over 10%"}
    base = report(tmp_path / "b.jsonl", [row("sdpa", 256, samples(1, n=40), **spread)])
    new = report(tmp_path / "n.jsonl", [row("sdpa", 256, samples(2, 2.0, n=40), **spread)])
    assert compare_reports(base, new, threshold_pct=10).points[0].verdict == "slower"


def test_one_sided_spread_makes_a_small_change_inconclusive_but_not_a_huge_one(tmp_path):
    """NEW far noisier than BASE (load that comes and goes on NEW's side): a 1.3x slowdown could be that load,
    a CI wholly past 2x could not (the CI test on a loaded CI runner: 100x with a 12% IQR against 2%)."""
    rng = np.random.default_rng(7)
    tight = [float(t) for t in rng.lognormal(math.log(10.0), 0.02, 20)]
    wide = [float(t) * f for t, f in zip(rng.lognormal(math.log(10.0), 0.02, 20), rng.choice([1.0, 1.6, 2.5], 20))]
    base = report(tmp_path / "b.jsonl", [row("sdpa", 256, tight)])
    for scale, expected in ((1.0, "inconclusive"), (100.0, "slower")):
        new = report(tmp_path / f"n{scale}.jsonl", [row("sdpa", 256, [t * scale for t in wide])])
        point = compare_reports(base, new, threshold_pct=10).points[0]
        assert point.verdict == expected, point
        assert ("far noisier" in (point.note or "")) == (expected == "inconclusive")
    faster = report(tmp_path / "f.jsonl", [row("sdpa", 256, [t / 100 for t in wide])])
    assert compare_reports(base, faster, threshold_pct=10).points[0].verdict == "faster"


def test_other_processes_cpu_differing_between_the_sides_is_inconclusive(tmp_path):
    """A 1-CPU neighbour on NEW's side only, below the bench's contention rule (1 thread on 2 CPUs): a slowdown the
    samples show cannot be told from that load."""
    base = report(tmp_path / "b.jsonl", [row("sdpa", 256, samples(1, n=40), other_cpus=0.05)])
    new = report(tmp_path / "n.jsonl", [row("sdpa", 256, samples(2, 1.3, n=40), other_cpus=1.02)])
    point = compare_reports(base, new, threshold_pct=10).points[0]
    assert point.verdict == "inconclusive" and "1.0 during NEW's" in point.note
    calm = report(tmp_path / "c.jsonl", [row("sdpa", 256, samples(2, 1.3, n=40), other_cpus=0.3)])
    assert compare_reports(base, calm, threshold_pct=10).points[0].verdict == "slower"


def test_a_point_between_same_and_faster_does_not_make_the_run_inconclusive(tmp_path):
    """A 9% speedup at a 10% threshold: its CI straddles the band's lower edge, so the point is inconclusive
    (same or faster, not which), but a regression is excluded and the gate passes; straddling the upper edge
    it is not excluded, and a flagged point never is."""

    def run(scale, **extra):
        base = report(tmp_path / "b.jsonl", [row("sdpa", 256, samples(1, n=40))])
        new = report(tmp_path / "n.jsonl", [row("sdpa", 256, samples(2, scale, n=40), **extra)])
        return compare_reports(base, new, threshold_pct=10)

    faster = run(0.91)
    point = faster.points[0]
    assert point.verdict == "inconclusive" and point.ci_low < 1 / 1.1 < point.ci_high < 1 and point.no_regression
    assert "regression beyond the threshold is excluded" in point.note and faster.exit_code() == 0
    slower = run(1.1)
    assert slower.points[0].verdict == "inconclusive" and not slower.points[0].no_regression
    assert slower.exit_code() == 3
    flagged = run(0.91, contended=True, noisy=True, noisy_reason="other processes kept 1.2 of 2 CPUs busy")
    assert not flagged.points[0].no_regression and flagged.exit_code() == 3
