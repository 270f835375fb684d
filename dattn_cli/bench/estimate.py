"""Quick peak-memory estimates, used to skip points that cannot fit before running them.

Stand-in until `dattn plan` has the full model. Expressed in units of one input tensor
x = B*N*H*D*itemsize; the coefficients were measured on CPU (fp32, B=1, H=8, D=64, segments
[2048, 4096, 8192], dilations [1, 2, 4], N = 16K..32K; see benchmarks/RESULTS.md), rounded up.
"""

from __future__ import annotations

from .config import DTYPE_BYTES, BenchConfig

# (fwd, fwd+bwd) peak memory in units of x, inputs included
LINEAR = {
    "sdpa": (5.0, 12.0),
    "flash": (5.0, 12.0),
    "DilatedAttention": (10.0, 19.0),
    "ImprovedDilatedAttention": (6.0, 13.0),
}


def estimate_peak_bytes(impl: str, cfg: BenchConfig, seq_len: int) -> int:
    itemsize = DTYPE_BYTES[cfg.dtype]
    x = cfg.batch * seq_len * cfg.heads * cfg.head_dim * itemsize
    fwdbwd = cfg.mode == "fwdbwd"
    if impl == "math":  # scores and probabilities, N x N per head (kept for backward)
        scores = cfg.batch * cfg.heads * seq_len * seq_len * itemsize
        return int((3 if fwdbwd else 2) * scores + (12 if fwdbwd else 5) * x)
    if impl == "reference":  # float64 copies plus a bounded block of scores and counts
        return int((16 if fwdbwd else 8) * x * 8 / itemsize + 64 * 2**20 * (3 if fwdbwd else 1))
    if impl.startswith("Multihead") or impl.startswith("ImprovedMultihead"):
        base = LINEAR["ImprovedDilatedAttention" if impl.startswith("Improved") else "DilatedAttention"]
        return int((base[fwdbwd] + (8 if fwdbwd else 4)) * x)  # projections and their activations
    fwd, both = LINEAR.get(impl, LINEAR["DilatedAttention"])
    return int((both if fwdbwd else fwd) * x)
