"""`dattn verify` as a library: every implementation against the dense reference, forward and grads."""

from .cases import OWN_CASE, OWN_PATTERNS, SLOW_REFERENCE_SCORES, Case, case_matrix, own_cases
from .checks import Checks
from .compare import FACTOR, FLOOR, tolerance_for
from .growth import error_growth, plot_growth
from .references import LOCAL_REFERENCE_ABOVE, reference_scores
from .report import CaseResult, GrowthPoint, VerifyReport
from .run import collect_checks, run_checks, run_verify

__all__ = [
    "FACTOR",
    "FLOOR",
    "LOCAL_REFERENCE_ABOVE",
    "GrowthPoint",
    "error_growth",
    "plot_growth",
    "OWN_CASE",
    "OWN_PATTERNS",
    "SLOW_REFERENCE_SCORES",
    "Case",
    "CaseResult",
    "Checks",
    "VerifyReport",
    "case_matrix",
    "collect_checks",
    "own_cases",
    "reference_scores",
    "run_checks",
    "run_verify",
    "tolerance_for",
]
