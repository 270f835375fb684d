"""`dattn compare`: two bench reports point by point, or two implementations of one report, with a statistical
verdict (dattn_cli/compare). Exit 0 no regression, 1 a regression beyond --threshold that the test establishes,
2 bad input, 3 inconclusive (too noisy, or the runs' environments differ)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import CsvOption, JsonOption, MarkdownOption, finite
from .render.common import emit_files, machine_output
from .render.compare import show_report

ReportsArgument = Annotated[
    list[Path],
    typer.Argument(
        help="BASE.jsonl NEW.jsonl (bench reports), or one RUN.jsonl with --a and --b.",
        metavar="REPORT...",
        show_default=False,
    ),
]
ImplAOption = Annotated[
    str | None, typer.Option("--a", help="In one report: this implementation (ratio = a / b).", metavar="IMPL")
]
ImplBOption = Annotated[str | None, typer.Option("--b", help="In one report: against this one.", metavar="IMPL")]
ThresholdOption = Annotated[
    float,
    typer.Option(
        "--threshold",
        help="The smallest change that counts, in percent.",
        metavar="PCT",
        callback=finite("--threshold", 0.0, 1000.0),
    ),
]


def compare(
    reports: ReportsArgument,
    impl_a: ImplAOption = None,
    impl_b: ImplBOption = None,
    threshold: ThresholdOption = 10.0,
    json_out: JsonOption = None,
    csv_out: CsvOption = None,
    markdown: MarkdownOption = None,
) -> None:
    """Compare two bench reports (NEW / BASE), or --a against --b in one report: ratio, 95% CI, p-value, verdict."""
    from ..compare import compare_impls, compare_reports

    machine_output(json_out, csv_out, markdown)
    if impl_a or impl_b:
        if not (impl_a and impl_b) or len(reports) != 1:
            raise ValueError(
                "--a IMPL --b IMPL compare two implementations of ONE report: dattn compare RUN.jsonl --a IMPL --b IMPL"
            )
        report, labels = compare_impls(reports[0], impl_a, impl_b, threshold), (impl_b, impl_a)
    elif len(reports) == 2:
        report, labels = compare_reports(reports[0], reports[1], threshold), ("base", "new")
    else:
        raise ValueError(f"give two reports (BASE.jsonl NEW.jsonl), or one with --a IMPL --b IMPL; got {len(reports)}")
    show_report(report, labels)
    summary = report.model_dump(include={"points", "verdict", "warnings", "comparable", "threshold_pct", "alpha"})
    emit_files(json_out, csv_out, summary, [p.model_dump() for p in report.points])
    if markdown:
        from .render.ci import compare_markdown, emit_markdown

        emit_markdown(markdown, compare_markdown(report))
    if code := report.exit_code():
        raise typer.Exit(code=code)
