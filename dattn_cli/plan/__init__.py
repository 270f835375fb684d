"""`dattn plan` as a library: predicted memory and time of a Problem on a hardware profile, from stated
models (docs/plan.md), the solvers built on them, and their check against measured bench rows.

Modules flow one way: memory (attention bytes) <- time (attention seconds) <- layers (blocks and models)
<- solve (plan, max_seq, min_devices, chunk advice); check and profiles sit beside them.
"""

from .solve import Plan, chunk_advice, max_seq, min_devices, plan, predicted_peak_bytes

__all__ = ["Plan", "chunk_advice", "max_seq", "min_devices", "plan", "predicted_peak_bytes"]
