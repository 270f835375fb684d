"""RingMultiheadDilatedAttention under torchrun: forward and backward on sequence shards, per-rank comm bytes
printed next to the closed-form volume of docs/communication.md. gloo on CPU, NCCL on CUDA (one process per GPU,
each on cuda:LOCAL_RANK).

    torchrun --nproc_per_node 2 examples/ring_multihead_torchrun.py

Every rank builds the same weights and the same full input from one seed and keeps its contiguous
shard. The longest segment (4096) spans both 2048-position shards, so its sparsified K/V (1/4 of the
rows, r = 4) travel around the ring; the shorter segments stay local.
"""

import os

import torch
import torch.distributed as dist

from dattn_cli.kernels import RingMultiheadDilatedAttention
from dattn_cli.kernels.distributed.sequence_parallel import comm_volume


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
    segments, dilations = [512, 1024, 4096], [1, 2, 4]
    torch.manual_seed(0)  # same weights on every rank, as DDP would make them
    attention = RingMultiheadDilatedAttention(
        heads * head_dim,
        heads,
        segment_lengths=segments,
        dilation_rates=dilations,
        process_group=dist.group.WORLD,
        device=device,
    )
    x = torch.randn(batch, seq_len, heads * head_dim, generator=torch.Generator().manual_seed(1))
    shard = x[:, rank * seq_len // world : (rank + 1) * seq_len // world].to(device, copy=True).requires_grad_()
    out, _ = attention(shard, shard, shard, is_causal=False)
    out.square().mean().backward()
    stats = attention.comm_stats()
    expected = comm_volume("ring", seq_len, world, batch, heads, head_dim, 4, segments, dilations)[rank]
    full_kv = 2 * batch * (seq_len // world) * heads * head_dim * 4
    print(
        f"rank {rank}/{world}: out {tuple(out.shape)}, |dx| {shard.grad.norm():.4f}; "
        f"forward sent {stats['forward_bytes_sent']:,} B, received {stats['forward_bytes_received']:,} B; "
        f"backward sent {stats['backward_bytes_sent']:,} B, received {stats['backward_bytes_received']:,} B; "
        f"formula {'matches' if all(stats[k] == v for k, v in expected.items()) else 'DIFFERS: ' + str(expected)}; "
        f"(unsparsified K/V shard would be {full_kv:,} B)",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
