"""Error growth with N: one point per implementation, quantity group and N, with the naive error; the plot."""

from dattn_cli.verify.growth import error_growth, plot_growth
from dattn_cli.verify.report import CaseResult, Error


def result(n, out, dq, naive):
    return CaseResult(
        impl="ImprovedDilatedAttention",
        case=f"N={n}",
        backend="auto",
        semantics="longnet",
        causal=False,
        dtype="bfloat16",
        device="cpu",
        batch=1,
        seq_len=n,
        heads=4,
        head_dim=8,
        segment_lengths=[16],
        dilation_rates=[1],
        uncovered_fraction=0.0,
        errors={
            "out": Error(abs=out, rel=out, naive=naive, limit=1.0, passed=True),
            "dq": Error(abs=dq, rel=dq, naive=naive, limit=1.0, passed=True),
            "dk": Error(abs=dq / 2, rel=dq / 2, naive=naive, limit=1.0, passed=True),
        },
        passed=True,
    )


def test_points_per_n_and_the_plot(tmp_path):
    points = error_growth([result(4096, 1e-3, 2e-3, 4e-3), result(16384, 2e-3, 3e-3, 5e-3)])
    grads = [(p.seq_len, p.error, p.naive) for p in points if p.quantity == "grads"]
    assert grads == [(4096, 2e-3, 4e-3), (16384, 3e-3, 5e-3)]  # the worst gradient, dq, at each N
    assert {p.quantity for p in points} == {"out", "grads"}
    path = tmp_path / "growth.png"
    plot_growth(points, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
