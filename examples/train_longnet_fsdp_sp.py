"""Train the small LongNetLM with FSDP2 over data-parallel groups and sequence parallelism inside each
sequence-parallel group (DistributedImprovedMultiheadDilatedAttention, the all-gather form, by default;
--attention picks another, e.g. RingMultiheadDilatedAttention).

    torchrun --standalone --nproc-per-node 4 examples/train_longnet_fsdp_sp.py --sp 2 --steps 2     # CPU, gloo
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        examples/train_longnet_fsdp_sp.py --sp 8 --seq-len 65536 --segments 2048,8192,65536 \\
        --dilations 1,4,16 --embed-dim 1024 --heads 16 --layers 12 --steps 100                   # GPUs, NCCL

Layout: the world's dp x sp ranks form a 2-D DeviceMesh ("dp", "sp"); consecutive ranks share a row, so a
sequence-parallel group stays inside a node when sp divides the GPUs per node. Each row ("sp" group) holds one
batch of whole sequences, every rank of it a contiguous shard of seq_len/sp tokens; the rows are the
data-parallel replicas. The attention exchanges the sparsified keys and values of the long segments inside the
"sp" group; LongNetLM gives each shard its rotary positions (rank in the sp group x shard length).

Gradients: FSDP2 (fully_shard over the "dp" dimension) shards the weights over the replicas, and its
reduce-scatter averages their gradients over "dp". A rank's loss covers only its shard of the sequence, so its
gradient is a part of its row's: the "sp" ranks' gradient shards are summed here (all_reduce over the "sp"
group, divided by sp for the mean over the row's tokens) before clipping and the optimizer step. (To shard the
weights over the sp ranks too, fully_shard over the flattened dp x sp mesh, as torchtitan's dp_shard_cp; that
takes DeviceMesh._flatten, a private API, and then FSDP's own reduce-scatter does the sum.)

Backend by device: gloo on CPU, NCCL on CUDA ("cpu:gloo,cuda:nccl": CUDA tensors over NCCL, the few CPU ones over
gloo), the CUDA device LOCAL_RANK. Tokens are random (a real job reads its row's data); rank 0 prints the loss
over all rows' tokens and the gradient norm each step.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from dattn_cli.models import LongNetLM


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sp", type=int, default=1, help="ranks per sequence-parallel group (divides the world)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (the whole, not a shard)")
    parser.add_argument("--batch", type=int, default=2, help="sequences per data-parallel replica and step")
    parser.add_argument("--segments", default="64,256", help="segment lengths, comma-separated")
    parser.add_argument("--dilations", default="1,4", help="dilation rates, comma-separated")
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--attention",
        default="DistributedImprovedMultiheadDilatedAttention",
        help="a sequence-parallel multihead implementation (dattn impls)",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def setup(sp: int):
    """The device, and the ("dp", "sp") mesh over the torchrun world."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    world = dist.get_world_size()
    if sp < 1 or world % sp:
        raise SystemExit(f"--sp {sp} does not divide the world size {world}: pass a divisor of {world}")
    mesh = init_device_mesh(device.type, (world // sp, sp), mesh_dim_names=("dp", "sp"))
    return device, mesh


def build(args: argparse.Namespace, mesh, device: torch.device) -> LongNetLM:
    torch.manual_seed(args.seed)  # the same initial weights on every rank; fully_shard keeps each rank's shard
    model = LongNetLM(
        args.vocab,
        args.embed_dim,
        args.heads,
        args.layers,
        segment_lengths=ints(args.segments),
        dilation_rates=ints(args.dilations),
        attention=args.attention,
        process_group=mesh["sp"].get_group(),
        device=device,
    )
    for block in model.blocks:  # one FSDP unit per block (its weights gathered just before it runs), then the rest
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def row_batch(args: argparse.Namespace, step: int, replica: int, device: torch.device) -> torch.Tensor:
    """The (batch, seq_len + 1) tokens of one data-parallel row at one step: the same on each of its sp ranks."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + replica)
    return torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), generator=g).to(device)


def train_step(model, optimizer, tokens: torch.Tensor, mesh) -> tuple[torch.Tensor, torch.Tensor]:
    """One step on this rank's shard of `tokens`; (loss over the whole world's tokens, gradient norm)."""
    sp, member = mesh["sp"].size(), mesh["sp"].get_local_rank()
    length = (tokens.shape[1] - 1) // sp
    shard = slice(member * length, (member + 1) * length)
    inputs, targets = tokens[:, :-1][:, shard], tokens[:, 1:][:, shard]  # the next token is a target across shards too
    loss = model.loss(inputs, targets)  # positions start at member * length: LongNetLM reads its sp group
    loss.backward()
    with torch.no_grad():
        for param in model.parameters():  # FSDP averaged over "dp"; the sp ranks' parts of a row's gradient add up
            if param.grad is not None:
                local = param.grad.to_local()
                dist.all_reduce(local, group=mesh["sp"].get_group())
                local.div_(sp)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mean = loss.detach().clone()
    dist.all_reduce(mean)  # equal shards: the mean of the ranks' means is the mean over every token
    return mean / dist.get_world_size(), norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device, mesh = setup(args.sp)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.seq_len % args.sp:
        raise SystemExit(f"--seq-len {args.seq_len} is not divisible by --sp {args.sp}: pick a multiple of {args.sp}")
    model = build(args, mesh, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if rank == 0:
        print(
            f"world {world} = dp {world // args.sp} x sp {args.sp} on {device.type} ({dist.get_backend()}); "
            f"{sum(p.numel() for p in model.parameters()):,} parameters; {model.blocks[0].attn.attention.describe()}",
            flush=True,
        )
    replica = mesh["dp"].get_local_rank()
    for step in range(1, args.steps + 1):
        loss, norm = train_step(model, optimizer, row_batch(args, step, replica, device), mesh)
        if rank == 0:
            print(f"step {step}/{args.steps} loss {loss.item():.6f} grad-norm {norm.item():.6f}", flush=True)
    dist.barrier()  # every rank's collectives done before any tears down: without it gloo aborted rank 0 at exit
    dist.destroy_process_group()  # ("terminate called without an active exception") in 2 of 3 runs on 2 cores


if __name__ == "__main__":
    main()
