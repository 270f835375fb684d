"""`dattn verify`: per implementation, or per case; warnings; the one-line verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from .common import heads_label, literal

if TYPE_CHECKING:
    from ...verify import CaseResult, VerifyReport


def _label(impl: str, world: int, layout: str = "contiguous") -> str:
    """The implementation of a row, as a table cell (escaped: plugin names are user text)."""
    shards = "" if layout == "contiguous" else f", {layout}"
    return literal(impl if world == 1 else f"{impl} (p={world}{shards})")


def verify_table(report: VerifyReport, details: bool = False) -> Table:
    """Per implementation: checks, failures, worst errors; per case (failures, or all with details)."""
    if details or not report.passed:
        return _verify_cases(report, details)
    dtypes = ", ".join(sorted({r.dtype for r in report.results}))
    table = Table(
        title=f"dattn verify ({dtypes}): worst relative error vs the float64 reference / the naive {dtypes} "
        "computation's"
    )
    table.add_column("impl", overflow="fold")
    for col in ("pattern", "checks", "out", "lse", "grads", "status"):
        justify = "left" if col in ("status", "pattern") else "right"
        table.add_column(col, justify=justify, no_wrap=True, min_width=len(col))
    for impl, world, layout, pattern in dict.fromkeys(
        (r.impl, r.world_size, r.layout, r.pattern) for r in report.results
    ):
        key = (impl, world, layout, pattern)
        rows = [r for r in report.results if (r.impl, r.world_size, r.layout, r.pattern) == key]
        bad = sum(not r.passed for r in rows)
        table.add_row(
            _label(impl, world, layout),
            literal(pattern or "-"),
            str(len(rows)),
            *(worst(rows, group) for group in ("out", "lse", "grads")),
            "[green]ok[/]" if not bad else f"[red]{bad} failed[/]",
        )
    return table


def worst(results: list, group: str) -> str:
    """The worst relative error of `group` (out, lse, or grads: every d*) over `results`, and after a slash the
    naive same-dtype computation's worst ("-": none)."""
    errors = [e for r in results for k, e in r.errors.items() if k == group or (group == "grads" and k.startswith("d"))]
    if not errors:
        return "-"
    naive = [e.naive for e in errors if e.naive is not None]
    return f"{max(e.rel for e in errors):.1e}" + (f" / {max(naive):.1e}" if naive else "")


def _verify_cases(report: VerifyReport, details: bool) -> Table:
    title = "all cases" if details else "failed cases"
    table = Table(title=f"dattn verify: {title} (relative error / the naive same-dtype computation's)")
    for col in ("impl", "pattern", "case", "sem", "causal", "backend", "dtype", "out", "lse", "grads", "status"):
        table.add_column(col, justify="right" if col in ("out", "lse", "grads") else "left", overflow="fold")
    for r in report.results if details else report.failures:
        status = "[green]ok[/]" if r.passed else f"[red]FAIL[/] {literal(r.message or '')}".strip()
        table.add_row(
            _label(r.impl, r.world_size, r.layout),
            literal(r.pattern or "-"),
            literal(r.case),
            r.semantics,
            "yes" if r.causal else "no",
            literal(r.backend),
            r.dtype,
            *(worst([r], group) for group in ("out", "lse", "grads")),
            status,
        )
    return table


def check_line(r: CaseResult) -> str:
    """One finished check, for progress: "ImprovedDilatedAttention 'ragged N' longnet causal ok"."""
    label = r.impl if r.world_size == 1 else f"{r.impl} (p={r.world_size})"  # progress prints it literally
    parts = [
        label,
        f"'{r.case}'",
        r.semantics,
        *([f"pattern {r.pattern}"] if r.pattern else []),
        "causal" if r.causal else "non-causal",
        *([r.backend] if r.backend != "auto" else []),
    ]
    return " ".join(parts) + (" ok" if r.passed else " FAILED")


def verify_warnings(report: VerifyReport, details: bool = False, own: bool = False) -> list[str]:
    """Rows that output 0 and what was skipped: in full for the user's own configuration (or --details);
    the built-in matrix's deliberate corner cases stay in the JSON report, with a one-line count of skips."""
    lines = _uncovered(report) if own or details else []
    if own or details:
        lines += [f"skipped: {reason}" for reason in report.skipped]
    elif report.skipped:
        lines.append(
            f"note: {len(report.skipped)} combinations of implementation, world size and case were "
            "skipped (--details lists them with the reason)"
        )
    return lines


def _uncovered(report: VerifyReport) -> list[str]:
    seen = {(r.case, r.semantics, r.pattern): r.uncovered_fraction for r in report.results if r.uncovered_fraction > 0}
    return [
        f"warning: case '{c}' ({s}{', pattern ' + p if p else ''}): {f:.0%} of (position, head) rows are kept "
        "by no pair and output 0 (docs/semantics.md)"
        for (c, s, p), f in seen.items()
    ]


def verify_summary(report: VerifyReport, own: bool = False) -> str:
    n, bad = len(report.results), len(report.failures)
    what = f"{n} check{'' if n == 1 else 's'}" + (f" of {_configuration(report)}" if own and report.results else "")
    if not bad:
        return f"[green]verify passed[/]: {literal(what)}, seed {report.seed}"
    names = sorted({f"{r.impl} ({r.case}, {r.semantics}, causal={r.causal})" for r in report.failures})
    failed = "; ".join(names[:8]) + (" ..." if len(names) > 8 else "")
    return f"[red]verify FAILED[/]: {bad} of {literal(what)}; " + literal(failed)


def _configuration(report: VerifyReport) -> str:
    """The user's configuration as checked: shape and pattern, semantics, causal."""
    shapes = dict.fromkeys(
        f"B={r.batch} N={r.seq_len:,} {heads_label(r.heads, r.kv_heads)} D={r.head_dim}, segments "
        f"{','.join(map(str, r.segment_lengths))}, dilations {','.join(map(str, r.dilation_rates))}"
        for r in report.results
    )
    semantics = " and ".join(dict.fromkeys(r.semantics for r in report.results))
    causal = " and ".join(dict.fromkeys("causal" if r.causal else "non-causal" for r in report.results))
    return "; ".join(shapes) + f", {semantics}, {causal}"
