"""`dattn bench` as a library: isolated, incremental, resumable sweeps."""

from .config import BenchConfig, parse_seq_lens, parse_size
from .plot import fit_exponent, plot_rows
from .regression import Regression, find_regressions
from .rows import BenchRow, read_rows, rows_frame
from .sweep import ImplSummary, SweepResult, run_sweep

__all__ = [
    "BenchConfig", "parse_seq_lens", "parse_size", "fit_exponent", "plot_rows", "Regression", "find_regressions",
    "BenchRow", "read_rows", "rows_frame", "ImplSummary", "SweepResult", "run_sweep",
]
