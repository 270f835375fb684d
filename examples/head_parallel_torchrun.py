"""Head-parallel dilated attention under torchrun, forward and backward, with byte counts: gloo on CPU, NCCL on
CUDA (one process per GPU, each on cuda:LOCAL_RANK).

    torchrun --nproc_per_node 2 examples/head_parallel_torchrun.py

Every rank builds the same full inputs from one seed, keeps its contiguous sequence shard, and prints
its output checksum and the bytes it sent and received (compare with docs/communication.md).
"""

import os

import torch
import torch.distributed as dist

from dattn_cli.kernels import HeadParallelDilatedAttention


def setup() -> torch.device:
    """gloo on CPU; on CUDA this rank's GPU and NCCL (gloo beside it for CPU tensors)."""
    if not torch.cuda.is_available():
        dist.init_process_group("gloo")
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("cpu:gloo,cuda:nccl")
    return device


def main() -> None:
    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    batch, seq_len, heads, head_dim = 1, 4096, 8, 64
    generator = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(batch, seq_len, heads, head_dim, generator=generator) for _ in range(4))
    shard = slice(rank * seq_len // world, (rank + 1) * seq_len // world)
    q, k, v = (x[:, shard].to(device, copy=True).requires_grad_() for x in (q, k, v))
    attention = HeadParallelDilatedAttention([512, 1024, 2048], [1, 2, 4])
    out = attention(q, k, v, is_causal=True)
    out.backward(grad[:, shard].to(device))
    stats = attention.comm_stats()
    print(
        f"rank {rank}/{world}: out shard {tuple(out.shape)} sum {out.sum().item():.4f}; "
        f"forward sent {stats['forward_bytes_sent']:,} B received {stats['forward_bytes_received']:,} B; "
        f"backward sent {stats['backward_bytes_sent']:,} B received {stats['backward_bytes_received']:,} B",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
