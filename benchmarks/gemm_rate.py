"""The host's float64 matmul rate, to date a CPU timing (verify's references run at it):

python benchmarks/gemm_rate.py
"""

import time

import torch

SIZE, REPEATS = 2048, 10


def main() -> None:
    a, b = (torch.randn(SIZE, SIZE, dtype=torch.float64) for _ in range(2))
    a @ b  # warm-up
    start = time.perf_counter()
    for _ in range(REPEATS):
        a @ b
    seconds = time.perf_counter() - start
    print(f"fp64 GEMM GFLOP/s {2 * SIZE**3 * REPEATS / seconds / 1e9:.0f}")


if __name__ == "__main__":
    main()
