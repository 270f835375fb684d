"""`dattn verify` as a library: every implementation against the dense reference, forward and grads."""

from .cases import VerifyCase, case_matrix
from .run import CaseResult, VerifyReport, run_verify, tolerance_for

__all__ = ["VerifyCase", "case_matrix", "CaseResult", "VerifyReport", "run_verify", "tolerance_for"]
