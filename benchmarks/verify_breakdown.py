"""Where `dattn verify`'s time goes on your configuration (issue 32 item 7): for each check of the run, the float64
reference, the naive same-dtype computation (each once per reference key, as verify shares them) and the
implementation, timed apart in one process (no comparisons, no report).

    python benchmarks/verify_breakdown.py [--seq-len 16384] [--heads 8] [--segments 2048,4096,8192] [--dilations 1,2,4]
"""

from __future__ import annotations

import argparse
import time

import torch

from dattn_cli.runtime.measure import reuse_freed_memory
from dattn_cli.verify import references
from dattn_cli.verify.cases import OWN_PATTERNS, own_cases
from dattn_cli.verify.compare import DTYPES
from dattn_cli.verify.run import collect_checks
from dattn_cli.verify.single import run_core, run_multihead


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--segments", default="2048,4096,8192")
    parser.add_argument("--dilations", default="1,2,4")
    a = parser.parse_args()
    reuse_freed_memory()  # as verify does
    shape = dict(heads=a.heads, segment_lengths=[int(x) for x in a.segments.split(",")])
    cases = own_cases([a.seq_len], dilation_rates=[int(x) for x in a.dilations.split(",")], **shape)
    checks = collect_checks(cases=cases, semantics=["longnet"], causal=[False], patterns=OWN_PATTERNS)
    seen, totals = set(), {"float64 references": 0.0, "naive computations": 0.0, "implementations": 0.0}
    for v in checks.single:
        p, seed = v.problem, references.case_seed(v.case, checks.seed)
        name = f"{p.impl}{f' ({p.pattern})' if p.pattern else ''}"
        if (key := references.reference_key(v.case, p, checks.seed)) not in seen:
            seen.add(key)
            ref = timed(references.reference_outputs, p, seed, torch.float64)
            naive = timed(references.reference_outputs, p, seed, DTYPES[p.dtype])
            totals["float64 references"] += ref
            totals["naive computations"] += naive
            print(f"reference of {name}: float64 {ref:.1f} s, naive {p.dtype} {naive:.1f} s", flush=True)
        impl = timed(run_multihead if p.spec.kind == "multihead" else run_core, p, seed)
        totals["implementations"] += impl
        print(f"implementation {name}: {impl:.1f} s", flush=True)
    print("; ".join(f"{k} {v:.1f} s" for k, v in totals.items()))


if __name__ == "__main__":
    main()
