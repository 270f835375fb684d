"""`dattn bench` as a library: isolated, incremental, resumable sweeps of measured points."""

from ..workload.records import BenchRow, read_rows, rows_frame
from .config import Sweep
from .plot import fit_exponent, plot_rows
from .sweep import ImplSummary, SweepResult, run_sweep

__all__ = [
    "Sweep",
    "fit_exponent",
    "plot_rows",
    "BenchRow",
    "read_rows",
    "rows_frame",
    "ImplSummary",
    "SweepResult",
    "run_sweep",
]
