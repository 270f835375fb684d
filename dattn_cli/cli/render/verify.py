"""`dattn verify`: per implementation, or per case; warnings; the one-line verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from .common import fmt_error

if TYPE_CHECKING:
    from ...verify import VerifyReport


def _label(impl: str, world: int) -> str:
    return impl if world == 1 else f"{impl} (p={world})"


def verify_table(report: VerifyReport, details: bool = False) -> Table:
    """Per implementation: checks, failures, worst errors; per case (failures, or all with details)."""
    if details or not report.passed:
        return _verify_cases(report, details)
    dtypes = ", ".join(sorted({r.dtype for r in report.results}))
    table = Table(title=f"dattn verify ({dtypes}): worst relative error vs the float64 reference")
    for col in ("impl", "pattern", "checks", "out", "lse", "grads", "status"):
        if col == "impl":
            table.add_column(col, overflow="fold")
        else:
            table.add_column(col, justify="left" if col in ("status", "pattern") else "right", no_wrap=True, min_width=len(col))
    for impl, world, pattern in dict.fromkeys((r.impl, r.world_size, r.pattern) for r in report.results):
        rows = [r for r in report.results if (r.impl, r.world_size, r.pattern) == (impl, world, pattern)]
        worst = {q: max((e.rel for r in rows for k, e in r.errors.items() if k == q or (q == "grads" and k.startswith("d"))),
                        default=None) for q in ("out", "lse", "grads")}
        bad = sum(not r.passed for r in rows)
        table.add_row(_label(impl, world), pattern or "-", str(len(rows)),
                      *(fmt_error(worst[q]) if worst[q] is not None else "-" for q in ("out", "lse", "grads")),
                      "[green]ok[/]" if not bad else f"[red]{bad} failed[/]")
    return table


def _verify_cases(report: VerifyReport, details: bool) -> Table:
    table = Table(title="dattn verify: " + ("all cases" if details else "failed cases") + " (relative error)")
    for col in ("impl", "pattern", "case", "sem", "causal", "backend", "dtype", "out", "lse", "grads", "status"):
        table.add_column(col, justify="right" if col in ("out", "lse", "grads") else "left", overflow="fold")
    for r in report.results if details else report.failures:
        grads = [e for k, e in r.errors.items() if k.startswith("d")]
        status = "[green]ok[/]" if r.passed else f"[red]FAIL[/] {r.message}".strip()
        table.add_row(
            _label(r.impl, r.world_size), r.pattern or "-", r.case, r.semantics, "yes" if r.causal else "no", r.backend,
            r.dtype,
            fmt_error(r.errors["out"].rel) if "out" in r.errors else "-",
            fmt_error(r.errors["lse"].rel) if "lse" in r.errors else "-",
            fmt_error(max(e.rel for e in grads)) if grads else "-",
            status,
        )
    return table


def verify_warnings(report: VerifyReport, details: bool = False) -> list[str]:
    seen = {}
    for r in report.results:
        if r.uncovered_fraction > 0:
            seen[(r.case, r.semantics)] = r.uncovered_fraction
    lines = [f"warning: case '{c}' ({s}): {f:.0%} of (position, head) rows are kept by no pair and output 0"
             for (c, s), f in seen.items()]
    if details:
        lines += [f"skipped: {reason}" for reason in report.skipped]
    elif report.skipped:
        lines.append(f"note: {len(report.skipped)} (implementation, world size, case) combinations cannot be sharded "
                     "and were skipped (--details lists them with the reason)")
    return lines


def verify_summary(report: VerifyReport) -> str:
    n, bad = len(report.results), len(report.failures)
    if not bad:
        return f"[green]verify passed[/]: {n} checks, seed {report.seed}"
    names = sorted({f"{r.impl} ({r.case}, {r.semantics}, causal={r.causal})" for r in report.failures})
    return f"[red]verify FAILED[/]: {bad} of {n} checks; " + "; ".join(names[:8]) + (" ..." if len(names) > 8 else "")
