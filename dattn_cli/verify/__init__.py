"""`dattn verify` as a library: every implementation against the dense reference, forward and grads."""

from .cases import (
    OWN_CASE as OWN_CASE,
    OWN_PATTERNS as OWN_PATTERNS,
    SLOW_REFERENCE_SCORES as SLOW_REFERENCE_SCORES,
    Case as Case,
    case_matrix as case_matrix,
    own_cases as own_cases,
)
from .checks import Checks as Checks
from .compare import FACTOR as FACTOR, FLOOR as FLOOR, tolerance_for as tolerance_for
from .growth import error_growth as error_growth, plot_growth as plot_growth
from .references import LOCAL_REFERENCE_ABOVE as LOCAL_REFERENCE_ABOVE, reference_scores as reference_scores
from .report import CaseResult as CaseResult, GrowthPoint as GrowthPoint, VerifyReport as VerifyReport
from .run import collect_checks as collect_checks, run_checks as run_checks, run_verify as run_verify
