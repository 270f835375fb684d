"""Quick peak-memory estimates, used to skip points that cannot fit before running them.

Stand-in until `dattn plan` has the full model. Expressed in units of one input tensor
x = B*N*H*D*itemsize, with coefficients measured on this project's CPU machine (fp32, B=1, H=8, D=64,
segments [2048, 4096, 8192], dilations [1, 2, 4]). Implementations not listed are assumed to be like
DilatedAttention.
"""

from __future__ import annotations

from .config import DTYPE_BYTES, BenchConfig

# (fwd, fwd+bwd) peak memory in units of x, inputs included; measured with `run_isolated` on CPU, fp32,
# H=8, D=64, N=16K-64K (e.g. ImprovedDilatedAttention: 5.81x at 32K and 5.76x at 64K fwd; 12.4x / 11.9x
# fwd+bwd), then rounded up by ~2%.
LINEAR = {
    "sdpa": (4.6, 10.0),
    "flash": (4.6, 10.0),  # not measured here (no GPU): assumed equal to sdpa
    "DilatedAttention": (10.0, 18.8),
    "ImprovedDilatedAttention": (6.0, 12.7),
    "MultiheadDilatedAttention": (12.1, 25.6),  # projections and their activations on top of the core
    "ImprovedMultiheadDilatedAttention": (8.7, 17.4),
    # distributed, per rank on its shard (x of the shard): assumed like ImprovedDilatedAttention, not fitted
    "RingDilatedAttention": (6.0, 12.7),
    "DistributedImprovedDilatedAttention": (6.0, 12.7),
    "HeadParallelDilatedAttention": (6.0, 12.7),
    "RingMultiheadDilatedAttention": (8.7, 17.4),
}
MATH_SCORE_COPIES = (2.1, 3.3)  # (fwd, fwd+bwd) N x N score tensors alive at the peak (measured at N=4096)


def estimate_peak_bytes(impl: str, cfg: BenchConfig, seq_len: int) -> int:
    itemsize = DTYPE_BYTES[cfg.dtype]
    x = cfg.batch * (seq_len // cfg.nproc) * cfg.heads * cfg.head_dim * itemsize
    fwdbwd = cfg.mode == "fwdbwd"
    if impl == "math":
        scores = cfg.batch * cfg.heads * seq_len * seq_len * itemsize
        return int(MATH_SCORE_COPIES[fwdbwd] * scores + LINEAR["sdpa"][fwdbwd] * x)
    if impl == "reference":  # float64 copies plus a bounded block of scores and counts
        return int((16 if fwdbwd else 8) * x * 8 / itemsize + 64 * 2**20 * (3 if fwdbwd else 1))
    return int(LINEAR.get(impl, LINEAR["DilatedAttention"])[fwdbwd] * x)
