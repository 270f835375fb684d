"""NCCL's own buffers on each GPU of a multi-device plan (plan --target model, --devices > 1, a GPU profile).

NCCL allocates for every connection it opens, per channel and peer: LL 0.5 MiB + LL128 4.69 MiB + Simple
NCCL_BUFFSIZE 4 MiB = 9.19 MiB, rounded up to 10 MiB by its cuMem allocations (NCCL src/transport/p2p.cc and
net.cc; NCCL_BUFFSIZE's default 4194304, NCCL user guide, env.rst). Since NCCL 2.22 (NCCL_RUNTIME_CONNECT=1) only
what a job runs is connected. Per communicator, as this planner counts it (NCCL >= 2.22):
* collectives (ring and tree algorithms): 16 channels x 2 connections x 10 MiB = 320 MiB. 16: "16 coll channels"
  in the H800 log of NVIDIA/nccl#892; the maintainer: memory is "linearly tied to the number of channels", ring
  uses 2 connections at any scale (sjeaugey, NVIDIA/nccl#864 and #986);
* point-to-point inside a node (ring attention's neighbours, all-to-all's peers): per peer 32 channels
  (NVIDIA/nccl#1685, 8 x H100: 32 channels a peer, allocations of 10 MiB and 2 MiB) x 12 MiB = 384 MiB; across
  nodes the send/recv pool is shared: 2 x 2 channels (NCCL_NCHANNELS_PER_NET_PEER, "typically 2", nccl#1424) x 16
  x 128 KiB (NCCL_P2P_NET_CHUNKSIZE) = 8 MiB.
Communicators per device (PyTorch: one per process group, made at its first collective): the world's; the
data-parallel group's and the sequence-parallel group's where both exist (dp > 1 and sp > 1); the tensor-parallel
group's and that of the devices sharing its shard (ZeRO's) where tensor parallelism is not the whole world
(collectives). The sequence-parallel group is the innermost (inside a node while sp <= devices per node); its
kind says what it runs: ring
(RingDilatedAttention...) send/recv with its two neighbours, allgather collectives, head_parallel all-to-all with
every peer, hybrid both.
Not counted: NVLink SHARP buffers on NVSwitch systems (256 MiB a GPU with NCCL >= 2.22, 768 MiB with 2.21, 1.5 GiB
before; NCCL_NVLS_ENABLE=0 turns them off), and the CUDA context (the profile's framework_overhead_gib).
"""

from __future__ import annotations

MiB = 2**20
CONNECTION = 10 * MiB
COLLECTIVES = 16 * 2 * CONNECTION
P2P_PEER_IN_NODE = 32 * (CONNECTION + 2 * MiB)
P2P_ACROSS_NODES = 2 * 2 * 16 * 128 * 1024
ITEM = "NCCL buffers"


def buffer_bytes(devices: int, sp: int, tp: int, strategy: str, devices_per_node: int) -> tuple[int, str]:
    """(bytes per device, what they are) of the communicators a layout of `devices` = dp x sp x tp makes (module
    docstring); (0, '') on one device."""
    if devices == 1:
        return 0, ""
    dp = devices // (sp * tp)
    communicators = 1 + (2 if sp > 1 and dp > 1 else 0) + (2 if 1 < tp < devices else 0)
    total, said = communicators * COLLECTIVES, [f"{communicators} communicator(s) x collectives"]
    if sp > 1 and strategy in ("ring", "head_parallel", "hybrid"):
        peers = min(2, sp - 1) if strategy == "ring" else sp - 1
        per_peer = P2P_PEER_IN_NODE if sp <= devices_per_node else 0
        p2p = peers * per_peer if per_peer else P2P_ACROSS_NODES
        total += p2p
        said.append(f"send/recv with {peers} peer(s) {'in the node' if per_peer else 'across nodes'}")
    return total, f"{ITEM} ({', '.join(said)}; docs/plan.md)"
