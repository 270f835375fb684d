"""The report of a run: one CaseResult per check (the JSON that `dattn verify --json` writes)."""

from __future__ import annotations

from pydantic import BaseModel

from .variants import Variant


class Error(BaseModel):
    """One quantity of one check (verify/compare.py): the implementation's error against the float64 reference,
    the naive same-dtype computation's, and the limit on `rel` they give."""

    abs: float  # max |impl - ref|
    rel: float  # abs / max |ref|
    naive: float | None = None  # the naive same-dtype computation's relative error (float64: 0, the reference)
    limit: float  # FACTOR x naive + FLOOR
    passed: bool


class CaseResult(BaseModel):
    impl: str
    world_size: int = 1
    layout: str = "contiguous"  # the shards' layout (kernels/distributed/layout.py)
    case: str
    backend: str
    semantics: str
    causal: bool
    dtype: str
    device: str
    batch: int
    seq_len: int
    heads: int
    kv_heads: int | None = None  # GQA/MQA key/value heads (None: as many as heads)
    head_dim: int
    segment_lengths: list[int]
    dilation_rates: list[int]
    uncovered_fraction: float
    pattern: str | None = None  # block-sparse implementations: the block pattern checked
    errors: dict[str, Error]
    passed: bool
    message: str = ""
    comm: list[dict[str, int]] | None = None  # distributed runs: each rank's comm_stats()


class GrowthPoint(BaseModel):
    """One implementation's worst error of one quantity group at one N, and the naive computation's."""

    impl: str
    world_size: int = 1
    pattern: str | None = None
    semantics: str
    causal: bool
    dtype: str
    quantity: str  # out, lse, or grads (the worst of the gradients)
    seq_len: int
    error: float  # the implementation's relative error against the float64 reference
    naive: float | None  # the naive same-dtype computation's


class VerifyReport(BaseModel):
    results: list[CaseResult]
    passed: bool
    seed: int
    skipped: list[str] = []  # what was not checked, and why (device, semantics, shard rules, refused cases)
    environment: dict | None = None  # filled by the CLI: versions, devices, command line
    growth: list[GrowthPoint] = []  # error against N (verify/growth.py), one point per line and N

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if not r.passed]


def case_result(
    v: Variant,
    errors: dict[str, Error] | None = None,
    *,
    failure: str | None = None,
    comm: list[dict[str, int]] | None = None,
) -> CaseResult:
    """The result of check `v`: its errors, or the failure that stopped it (a crash is a failed check)."""
    errors = errors or {}
    shared = {
        name: getattr(v.problem, name) for name in CaseResult.model_fields if name in type(v.problem).model_fields
    }
    passed = failure is None and all(e.passed for e in errors.values())
    own = dict(case=v.case, uncovered_fraction=v.uncovered, pattern=v.pattern, errors=errors, passed=passed)
    return CaseResult(**{**shared, **own}, message=failure or "", comm=comm)
