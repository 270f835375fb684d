"""Time and peak memory against N on log-log axes, with each line's fitted scaling exponent."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel

from ..workload.records import BenchRow


def _least_squares(pts: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(slope, intercept) of the least-squares line of y on x; None without two distinct x."""
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    if var == 0:
        return None
    slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / var
    return slope, my - slope * mx


def fit_exponent(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y on log x: y ~ N^slope. None with fewer than two points."""
    fit = _least_squares([(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0])
    return None if fit is None else fit[0]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, dpi: int) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    _pyplot().close(fig)


def plot_rows(rows: list[BenchRow], path: Path) -> dict[str, dict[str, float | None]]:
    """Write the PNG; return the fitted exponents per implementation and quantity."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    quantities = (("time_ms", "time per call (ms)", "time"), ("peak_mem_bytes", "peak memory (MiB)", "memory"))
    exponents: dict[str, dict[str, float | None]] = {}
    impls = list(dict.fromkeys(r.impl for r in rows))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (field, label, name) in zip(axes, quantities):
        scale = 2**20 if field == "peak_mem_bytes" else 1
        for i, impl in enumerate(impls):
            color = colors[i % len(colors)]
            ok = sorted(
                (r for r in rows if r.impl == impl and r.status == "ok" and getattr(r, field)), key=lambda r: r.seq_len
            )
            xs = [r.seq_len for r in ok]
            ys = [getattr(r, field) / scale for r in ok]
            slope = fit_exponent(xs, ys)
            exponents.setdefault(impl, {})[name] = slope
            legend = f"{impl}: {name} ~ N^{slope:.2f}" if slope is not None else f"{impl}"
            if ok:
                ax.plot(xs, ys, "o-", color=color, label=legend)
            failed = sorted(
                (r for r in rows if r.impl == impl and r.status in ("oom", "skipped", "error")), key=lambda r: r.seq_len
            )
            if failed:
                first = failed[0]
                mark = f"{impl}: {first.status} at N={first.seq_len}"
                ax.scatter(
                    [first.seq_len], [ys[-1] if ys else 1.0], marker="x", s=90, color=color, zorder=5, label=mark
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    sample = rows[0] if rows else None
    if sample:
        fig.suptitle(
            f"dattn bench: {sample.mode}, {sample.dtype}, B={sample.batch} H={sample.heads} D={sample.head_dim}, "
            f"segments {sample.segments}, dilations {sample.dilations}, {sample.device}",
            fontsize=9,
        )
    _save(fig, path, 110)
    return exponents


class DensityFit(BaseModel):
    """time = intercept + slope · density, fitted per (implementation, N) over the measured densities."""

    impl: str
    seq_len: int
    densities: list[float]
    times_ms: list[float]
    slope_ms: float | None  # ms per unit of element density
    intercept_ms: float | None
    exponent: float | None  # log-log slope: 1.0 = time proportional to density

    def line(self) -> str:
        if self.slope_ms is None:
            return f"{self.impl} N={self.seq_len}: fewer than two densities measured"
        return (
            f"{self.impl} N={self.seq_len}: time = {self.intercept_ms:.1f} ms + {self.slope_ms:.1f} ms x density "
            f"(log-log exponent {self.exponent:.2f}; 1.00 = proportional)"
        )


def fit_density(rows: list[BenchRow]) -> list[DensityFit]:
    groups: dict[tuple[str, int], list[BenchRow]] = {}
    for r in rows:
        if r.status == "ok" and r.element_density is not None and r.time_ms:
            groups.setdefault((r.impl, r.seq_len), []).append(r)
    fits = []
    for (impl, n), group in groups.items():
        group.sort(key=lambda r: r.element_density)
        xs, ys = [r.element_density for r in group], [r.time_ms for r in group]
        slope, intercept = _least_squares(list(zip(xs, ys))) or (None, None)
        fits.append(
            DensityFit(
                impl=impl,
                seq_len=n,
                densities=xs,
                times_ms=ys,
                slope_ms=slope,
                intercept_ms=intercept,
                exponent=fit_exponent(xs, ys),
            )
        )
    return fits


def plot_density(rows: list[BenchRow], path: Path) -> list[DensityFit]:
    """Time against element density (linear axes) per (implementation, N), dense baselines as horizontal
    lines; returns the fits."""
    plt = _pyplot()
    fits = fit_density(rows)
    fig, ax = plt.subplots(figsize=(7, 5))
    for fit in fits:
        label = f"{fit.impl} N={fit.seq_len}" + (f": exponent {fit.exponent:.2f}" if fit.exponent is not None else "")
        ax.plot(fit.densities, fit.times_ms, "o-", label=label)
        if fit.slope_ms is not None:
            xs = [0.0, max(fit.densities)]
            ax.plot(xs, [fit.intercept_ms + fit.slope_ms * x for x in xs], ":", color="gray")
    for r in rows:
        if r.status == "ok" and r.pattern is None and r.time_ms:
            ax.axhline(r.time_ms, linestyle="--", linewidth=1, label=f"{r.impl} (dense) N={r.seq_len}", color="black")
    ax.set_xlabel("element density (attended pairs / N²)")
    ax.set_ylabel("time per call (ms)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, path, 110)
    return fits


def plot_block_table(table, path: Path, title: str, causal: bool = False) -> None:
    """The block table as an image: a dark cell = the query block (row) attends the key block (column);
    with causal, the blocks above the diagonal (never computed) are shown lighter."""
    import torch

    plt = _pyplot()

    shown = table.to(torch.float32)
    if causal:
        shown = torch.where(torch.ones_like(table).triu(1) & table, 0.35, shown)
    fig, ax = plt.subplots(figsize=(6, 6))
    ax.imshow(shown.numpy(), cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xlabel("key block")
    ax.set_ylabel("query block")
    ax.set_title(title, fontsize=8)
    _save(fig, path, 120)
