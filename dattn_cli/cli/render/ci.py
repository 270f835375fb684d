"""CI outputs: JUnit XML of a verify run (one test case per check), and Markdown tables of bench, verify and compare
results, written to a file and appended to $GITHUB_STEP_SUMMARY when that is set (a GitHub Actions job summary)."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from .common import emit
from .compare import ms, point_cells
from .verify import worst

if TYPE_CHECKING:
    from ...compare import CompareReport
    from ...verify.report import CaseResult, VerifyReport
    from ...workload.records import BenchRow


def _check_name(r: CaseResult) -> str:
    parts = [r.case, r.semantics, "causal" if r.causal else "non-causal", r.backend, r.dtype]
    parts += [f"pattern {r.pattern}"] * bool(r.pattern) + [f"p={r.world_size}"] * (r.world_size > 1)
    return " ".join(map(str, parts))


def _suite(parent: ET.Element, name: str, tests: int, failures: int, skipped: int = 0) -> ET.Element:
    counts = dict(tests=str(tests), failures=str(failures), skipped=str(skipped))
    return ET.SubElement(parent, "testsuite", name=name, **counts)


def junit_xml(report: VerifyReport) -> str:
    """One <testsuite> per implementation, one <testcase> per check; a failed check carries its errors."""
    suites = ET.Element(
        "testsuites", name="dattn verify", tests=str(len(report.results)), failures=str(len(report.failures))
    )
    by_impl: dict[str, list] = {}
    for r in report.results:
        by_impl.setdefault(r.impl, []).append(r)
    for impl, results in by_impl.items():
        suite = _suite(suites, impl, len(results), sum(not r.passed for r in results))
        for r in results:
            case = ET.SubElement(suite, "testcase", classname=f"dattn.verify.{impl}", name=_check_name(r))
            errors = "; ".join(
                f"{k} rel {e.rel:.2e} (naive {e.naive if e.naive is not None else float('nan'):.2e}, "
                f"limit {e.limit:.1e})"
                for k, e in r.errors.items()
            )
            if not r.passed:
                ET.SubElement(case, "failure", message=(r.message or "error above the limit")[:500]).text = errors
            else:
                ET.SubElement(case, "system-out").text = errors
    if report.skipped:
        skipped = _suite(suites, "skipped", len(report.skipped), 0, len(report.skipped))
        for reason in report.skipped:
            ET.SubElement(
                ET.SubElement(skipped, "testcase", classname="dattn.verify", name=reason[:200]),
                "skipped",
                message=reason[:500],
            )
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: list[str], rows: Iterable[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def bench_markdown(rows: list[BenchRow]) -> str:
    table = markdown_table(
        ["impl", "N", "mode", "status", "median ms", "p10-p90 ms", "noise", "peak MiB"],
        (
            [
                r.impl,
                f"{r.seq_len:,}",
                r.mode,
                r.status + (f" ({r.reason})" if r.reason else ""),
                ms(r.time_ms),
                "-" if r.time_ms_p10 is None else f"{r.time_ms_p10:,.2f}-{r.time_ms_p90:,.2f}",
                "-" if r.noise is None else f"{r.noise:.0%}" + (" noisy" if r.noisy else ""),
                "-" if r.peak_mem_bytes is None else f"{r.peak_mem_bytes / 2**20:,.1f}",
            ]
            for r in rows
        ),
    )
    return "### dattn bench\n\n" + table


def verify_markdown(report: VerifyReport) -> str:
    table = markdown_table(
        ["impl", "check", "out / naive", "grads / naive", "status"],
        (
            [
                r.impl,
                _check_name(r),
                worst([r], "out"),
                worst([r], "grads"),
                "ok" if r.passed else f"FAIL {r.message or ''}".strip(),
            ]
            for r in report.results
        ),
    )
    verdict = "passed" if report.passed else f"FAILED ({len(report.failures)} of {len(report.results)})"
    return f"### dattn verify: {verdict}\n\n" + table


def compare_markdown(report: CompareReport) -> str:
    table = markdown_table(
        ["impl", "N", "mode", "base ms", "new ms", "ratio", "95% CI", "p", "verdict"],
        ([*point_cells(p), p.verdict] for p in report.points),
    )
    warnings = "".join(f"\n> warning: {_cell(w)}\n" for w in report.warnings)
    return f"### dattn compare: {report.verdict}\n\n" + table + warnings


def emit_markdown(target: str, text: str) -> None:
    """To --markdown FILE ('-' = stdout), and appended to $GITHUB_STEP_SUMMARY when it is set (and is not FILE)."""
    emit(target, text)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and (target == "-" or Path(summary).resolve() != Path(target).resolve()):
        with Path(summary).open("a") as f:
            f.write(text + "\n")
