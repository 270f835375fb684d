"""`dattn verify` as a library: every implementation against the dense reference, forward and grads."""

from .cases import Case, case_matrix
from .compare import tolerance_for
from .report import CaseResult, VerifyReport
from .run import run_verify

__all__ = ["Case", "case_matrix", "CaseResult", "VerifyReport", "run_verify", "tolerance_for"]
