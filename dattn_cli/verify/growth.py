"""Error growth with N: per implementation (and world size, block pattern, semantics, causal flag) and
quantity group, its worst relative error and the naive same-dtype computation's at each N checked
(`dattn verify --seq-len 4k,16k,64k --json -` carries them as `growth`; `--plot FILE.png` draws them)."""

from __future__ import annotations

from pathlib import Path

from .report import CaseResult, GrowthPoint

GROUPS = ("out", "lse", "grads")


def _group(quantity: str) -> str:
    return "grads" if quantity.startswith("d") else quantity


def error_growth(results: list[CaseResult]) -> list[GrowthPoint]:
    """One point per line and N: the worst error of the group's quantities at that N, with its naive error."""
    points: dict[tuple, GrowthPoint] = {}
    for r in results:
        for quantity, e in r.errors.items():
            group = _group(quantity)
            key = (r.impl, r.world_size, r.pattern, r.semantics, r.causal, r.dtype, group, r.seq_len)
            old = points.get(key)
            if old is None or e.rel > old.error:
                line = {name: getattr(r, name) for name in GrowthPoint.model_fields if name in CaseResult.model_fields}
                naive = e.naive if old is None or old.naive is None else max(old.naive, e.naive or 0.0)
                points[key] = GrowthPoint(**line, quantity=group, error=e.rel, naive=naive)
    return sorted(points.values(), key=lambda p: (p.quantity, p.impl, p.world_size, str(p.pattern), p.seq_len))


def _line(p: GrowthPoint) -> str:
    name = p.impl + (f" p={p.world_size}" if p.world_size > 1 else "") + (f" [{p.pattern}]" if p.pattern else "")
    return name + ("" if p.semantics == "longnet" else f" {p.semantics}") + (" causal" if p.causal else "")


def plot_growth(points: list[GrowthPoint], path: str | Path) -> None:
    """Relative error against N on log-log axes, one panel per quantity group: each implementation's line
    and, dashed, the naive same-dtype computation's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [g for g in GROUPS if any(p.quantity == g for p in points)] or ["out"]
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lines = list(dict.fromkeys(_line(p) for p in points))
    for ax, group in zip(axes[0], groups):
        for i, line in enumerate(lines):
            mine = sorted((p for p in points if p.quantity == group and _line(p) == line), key=lambda p: p.seq_len)
            if not mine:
                continue
            color = colors[i % len(colors)]
            ns = [p.seq_len for p in mine]
            ax.plot(ns, [max(p.error, 1e-18) for p in mine], "o-", color=color, label=line)
            naive = [(p.seq_len, p.naive) for p in mine if p.naive]
            if naive:
                ax.plot(*zip(*naive), "x--", color=color, alpha=0.6, label=f"{line}: naive {mine[0].dtype}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(f"relative error of {group} vs float64")
        ax.set_title(group)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
