"""Work balance of packed documents over ranks (issue 30, item 3): layout="documents" against contiguous shards.

Document lengths: a seeded log-normal mix (lengths exp(N(mu, sigma)), at least 1 token) packed up to T tokens.
Work: each rank's causal (query, key) pairs, counted exactly on the rows it holds (rank_pairs: a row at index j of
its document attends j + 1 keys), max/mean over p ranks. Both layouts are counted the same way; contiguous
shards' figure is a lower bound of what they cost, since their crossing documents are computed whole on every
rank holding part of them (distributed/documents.py). Also: rows per rank under layout="documents" (the padding
of the spread documents' zigzag chunks and of the shorter shards), and how many documents are spread.

Target (not a timed test): max/mean <= 1.10 under layout="documents" at p = 8.

    python benchmarks/document_balance.py [--tokens 65536] [--mu 6.5] [--sigma 1.0] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse

import torch

from dattn_cli.kernels.distributed.document_layout import document_layout, rank_pairs
from dattn_cli.kernels.documents import offsets


def lengths(tokens: int, mu: float, sigma: float, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    out, total = [], 0
    while total < tokens:
        n = max(1, int(torch.exp(torch.randn((), generator=g) * sigma + mu)))
        n = min(n, tokens - total)
        out.append(n)
        total += n
    return out


def balance(docs: list[int], world: int, segments: list[int] | None) -> dict[str, float]:
    cu = offsets(docs)
    total = int(cu[-1])
    shard = -(-total // world)
    contiguous = torch.arange(world * shard).view(world, shard)
    contiguous = torch.where(contiguous < total, contiguous, -1)
    layout = document_layout(cu, world, segments)
    ratio = lambda work: (work.max() / work.double().mean()).item()  # noqa: E731
    return {
        "contiguous": ratio(rank_pairs(contiguous, cu)),
        "documents": ratio(rank_pairs(layout.positions, cu)),
        "rows": layout.positions.numel() / total,
        "spread": len(layout.spread),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--mu", type=float, default=6.5, help="log-normal mu (median length e^mu, 665 at 6.5)")
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    patterns = {"dense (no segments)": None, "segments [2048, 4096, 8192]": [2048, 4096, 8192]}
    for seed in args.seeds:
        docs = lengths(args.tokens, args.mu, args.sigma, seed)
        print(
            f"seed {seed}: T={sum(docs)}, {len(docs)} documents, longest {max(docs)}, median "
            f"{sorted(docs)[len(docs) // 2]} (log-normal mu={args.mu} sigma={args.sigma})"
        )
        for name, segments in patterns.items():
            for world in (4, 8):
                b = balance(docs, world, segments)
                print(
                    f"  {name:28s} p={world}: causal pairs max/mean contiguous {b['contiguous']:.3f}  "
                    f"documents {b['documents']:.3f}  (rows/T {b['rows']:.3f}, {b['spread']} spread)"
                )


if __name__ == "__main__":
    main()
