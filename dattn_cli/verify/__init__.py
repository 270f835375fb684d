"""`dattn verify` as a library: every implementation against the dense reference, forward and grads."""

from .cases import OWN_CASE, OWN_PATTERNS, SLOW_REFERENCE_SCORES, Case, case_matrix, own_cases, reference_scores
from .checks import Checks
from .compare import tolerance_for
from .report import CaseResult, VerifyReport
from .run import collect_checks, run_checks, run_verify

__all__ = [
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
