"""`dattn bench`'s files and what follows the sweep: the file options checked before anything is measured,
the table, --csv/--json/--plot/--markdown, what a signal leaves, and the regression gate against --baseline.
`o` is the command's options (cli/bench.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import typer

from ..runtime.signals import Interrupted, take_pending
from .render.bench import bench_table, scaling_lines
from .render.common import emit, emit_json, note, stdout


def command_line() -> list[str]:
    return ["dattn", *sys.argv[1:]]


def check_outputs(o: SimpleNamespace):
    """Every file option checked before anything is measured; the baseline report (None without one)."""
    from ..compare import load_report
    from ..workload.reportfile import check_distinct, check_output_path, check_report_path

    files = {"--csv": o.csv_out, "--json": o.json_out, "--plot": o.plot, "--markdown": o.markdown}
    if (o.fail_on_regression is None) != (o.baseline is None):
        raise ValueError("--baseline and --fail-on-regression go together: give both")
    if o.resume and o.out is None:
        raise ValueError("--resume needs --out FILE.jsonl, the report to continue")
    check_distinct({"--baseline": o.baseline, "--out": o.out, **files}, inputs=("--baseline",))
    if o.out is not None:
        check_report_path(o.out, "--out")
    for option, path in files.items():
        check_output_path(path, option)
    if o.baseline is None:
        return None
    loaded = load_report(o.baseline, "--baseline")
    if not any(side.row.status == "ok" for side in loaded.points):
        raise ValueError(
            f"--baseline {o.baseline}: no ok point to compare against; give a report `dattn bench --out` wrote"
        )
    return loaded


def fail(message: str) -> None:
    print(f"dattn: error: {message}", file=sys.stderr)
    raise typer.Exit(code=1)


def _write(sweep, result, o: SimpleNamespace, interrupted: str | None = None) -> None:
    from ..bench import rows_frame

    if o.csv_out:
        emit(o.csv_out, rows_frame(result.rows).to_csv(index=False))
    if o.json_out:
        from ..bench.sweep import environment_record

        environment = result.environment or environment_record(sweep, command_line())  # interrupted: no end record
        emit_json(
            o.json_out,
            {
                "environment": environment,
                **({"interrupted": interrupted} if interrupted else {}),
                "summaries": [s.model_dump() for s in result.summaries],
                "rows": [r.model_dump() for r in result.rows],
            },
        )


def _points(n: int) -> str:
    return f"{n} point{'' if n == 1 else 's'}"


def interrupted(sweep, exc: Interrupted, o: SimpleNamespace) -> Interrupted:
    """What a signal leaves: the rows measured before it (each already in --out), --csv/--json of those rows
    (the JSON says "interrupted"), and the sentence saying what was kept."""
    take_pending()  # caught: not delivered again while the files are written
    if exc.partial is None:
        return Interrupted(exc.signum, "before the first point, nothing measured")
    rows = exc.partial.rows
    if rows and (o.csv_out or o.json_out):
        try:
            _write(sweep, exc.partial, o, interrupted=exc.name)
        except OSError:
            pass  # the --out report holds the rows; the message says so
    if o.out is not None:
        return Interrupted(exc.signum, f"{_points(len(rows))} kept in {o.out}; rerun with --resume")
    return Interrupted(
        exc.signum,
        f"nothing kept ({_points(len(rows))} measured, no --out): pass --out FILE.jsonl "
        "to keep points as they are measured, and --resume to continue",
    )


def points_kept(report: Path | None) -> str:
    """What a fault in an attached world left: the point rows in rank 0's report (read where it is visible)."""
    if report is None:
        return "nothing kept (no --out): pass --out FILE.jsonl to keep points as they are measured"
    try:
        lines = Path(report).read_text().splitlines()
    except OSError:
        return f"the points measured before it are kept in rank 0's {report}; rerun with --resume"
    points = sum(1 for line in lines if _point_line(line))
    return f"{_points(points)} kept in {report}; rerun with --resume"


def _point_line(line: str) -> bool:
    try:
        data = json.loads(line)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("record", "point") == "point"


def show(sweep, result, o: SimpleNamespace) -> None:
    """The table and its scaling lines, then --csv, --json, --plot and --markdown; a file that cannot be written
    (e.g. the disk filled up after the sweep) is one line and exit 1: the input was fine, and the --out report
    is complete."""
    stdout.print(bench_table(result))
    for line in scaling_lines(result):
        stdout.print(line, markup=False, highlight=False)
    try:
        _write(sweep, result, o)
        if o.plot is not None:
            _plot(sweep, result, o.plot, o.plot_x)
        if o.markdown:
            from .render.ci import bench_markdown, emit_markdown

            emit_markdown(o.markdown, bench_markdown(result.rows))
    except OSError as exc:
        fail(
            f"cannot write {exc.filename or 'an output file'}: {exc.strerror or exc}"
            + (f"; the report {o.out} is complete" if o.out is not None else "")
        )


def _plot(sweep, result, plot, plot_x: str | None) -> None:
    from ..bench import plot_rows

    if (plot_x or ("density" if len(sweep.densities) > 1 else "seq_len")) == "density":
        from ..bench.plot import plot_density

        for fit in plot_density(result.rows, plot):
            note(fit.line())
    else:
        plot_rows(result.rows, plot)  # its exponents are the ones printed under the table
    note(f"plot written to {plot}")


def gate(result, baseline, threshold: float) -> int:
    """The regression gate: dattn compare's test of this run against the baseline; exit 1 on an established
    regression beyond the threshold, 3 when the comparison is inconclusive (noise, or other environments)."""
    from ..compare import compare_rows
    from .render.compare import show_report

    report = compare_rows(baseline, result.rows, threshold, environment=result.environment)
    show_report(report, ("baseline", "this run"), title=f"regression gate (--fail-on-regression {threshold:g}%): ")
    return report.exit_code()
