"""`dattn bench` as a library: isolated, incremental, resumable sweeps of measured points."""

from ..workload.records import BenchRow as BenchRow, read_rows as read_rows, rows_frame as rows_frame
from .config import Sweep as Sweep
from .plot import fit_exponent as fit_exponent, plot_rows as plot_rows
from .sweep import ImplSummary as ImplSummary, SweepResult as SweepResult, run_sweep as run_sweep
