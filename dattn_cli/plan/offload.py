"""CPU offload, `plan --offload activations,optimizer,parameters` (any subset): what leaves the device, what the
host then holds, and the copies over the device's host link that a step adds.

* activations: the checkpointed block inputs (full recompute: each block keeps only its input, T·E·p) are
  copied to host memory in the forward and back before each block's recompute in the backward; the device
  holds two (the one being copied and the one in use): ALST's activation checkpoint offload to CPU (Bekman
  et al. 2025, arXiv:2506.13996). Without full recompute there is no checkpointed input to move (refused).
* optimizer: ZeRO-Offload (Ren et al. 2021, arXiv:2101.06840): the optimizer states and the fp32 master copy live
  in host memory and the step runs on the host's CPUs, in place (no temporary), reading an fp32 gradient
  partition kept in pinned host memory (DeepSpeed's offload_optimizer, ZeRO stage >= 1: its CPU Adam on fp32
  states, so not 8-bit Adam). Each step copies the device's gradient shard to the host (under the backward, as
  DeepSpeed overlaps it) and the updated weight shard back (exposed: nothing left to hide under). The CPU step
  is memory-bound at the host's DRAM bandwidth shared by the node's devices (a model, as the device step's is).
* parameters: ZeRO-Infinity's offload_param (Rajbhandari et al. 2021, arXiv:2104.07857; ZeRO stage 3 only):
  the device's parameter shard lives in host memory and is copied in before its all-gather, in the forward
  and again in the backward, prefetched under compute; the gathered units stay as ZeRO-3 has them (on one device
  too). Without the optimizer offloaded, the device's step updates the shard, copied back after it (exposed).

Host bytes per node: each device's offloaded bytes times the devices on a node (min(devices, the profile's
devices_per_node)); a plan whose host side exceeds the profile's `host.memory_gib_per_node` does not fit.
Copies: bytes / (host link bandwidth x the communication efficiency) + one latency per block. The copies of one
direction in one pass (forward, backward) share the link: they are hidden together under that pass's compute,
and what exceeds it is exposed. Every device is assumed to have its own link to the host (a PCIe switch shared by
two GPUs halves it: not modelled).
"""

from __future__ import annotations

from typing import Literal

from ..workload.problem import ELEMENT_BYTES, Problem

Offload = Literal["activations", "optimizer", "parameters"]
KINDS: tuple[str, ...] = ("activations", "optimizer", "parameters")
OFFLOADED_STATES = {  # model-state items (plan/parallel.py) that move to the host, by offload kind
    "optimizer": ("optimizer states", "fp32 master weights"),
    "parameters": ("parameters",),
}
HOST_GRADIENTS = "fp32 gradient partition (pinned, on the host)"  # what ZeRO-Offload's CPU step reads
DEVICE_CHECKPOINTS = 2  # checkpointed inputs left on the device with activations offloaded: in flight + in use


def parse(text: str | None) -> tuple[str, ...]:
    """'activations,optimizer' -> ('activations', 'optimizer'), in KINDS order; ValueError naming the option."""
    if not text:
        return ()
    given = [part.strip() for part in str(text).split(",") if part.strip()]
    if unknown := [part for part in given if part not in KINDS]:
        raise ValueError(f"--offload {unknown[0]!r} is not offloadable: use any of {', '.join(KINDS)}, comma-separated")
    return tuple(kind for kind in KINDS if kind in given)


def check(s: Problem, t, has_host: bool, profile: str) -> None:
    """Each kind's precondition (module docstring) under the Training `t`; ValueError naming the option and the
    way out."""
    offload, zero = t.offload, t.zero
    if not offload:
        return
    if not has_host:
        raise ValueError(
            f"--offload needs the device's host link and host memory: profile {profile!r} has no host section "
            "(add host: link, memory_gib_per_node, memory_bandwidth_gb_s to a copy of it)"
        )
    if s.mode != "fwdbwd":
        raise ValueError("--offload applies to a training step: use --mode fwdbwd")
    if "activations" in offload and not s.checkpointing:
        raise ValueError("--offload activations moves the checkpointed block inputs: add --recompute full")
    if "optimizer" in offload and zero < 1:
        raise ValueError("--offload optimizer is ZeRO-Offload (DeepSpeed offload_optimizer): use --zero 1, 2 or 3")
    if "optimizer" in offload and t.optimizer in ("adam8bit", "torch-adamw"):
        raise ValueError(
            f"--offload optimizer runs DeepSpeed's CPU Adam on fp32 states, not --optimizer {t.optimizer}: "
            "use --optimizer adamw or sgd"
        )
    if "parameters" in offload and zero != 3:
        raise ValueError("--offload parameters is ZeRO-Infinity's offload_param, ZeRO-3 only: use --zero 3")


def is_offloaded(item: str, offload: tuple[str, ...]) -> bool:
    """Whether a model-state item (its name, as plan/parallel.py gives it) lives on the host."""
    return any(item.startswith(prefix) for kind in offload for prefix in OFFLOADED_STATES.get(kind, ()))


def split(items: dict[str, int], offload: tuple[str, ...]) -> tuple[dict[str, int], dict[str, int]]:
    """(the items left on the device, those on the host)."""
    host = {k: v for k, v in items.items() if is_offloaded(k, offload)}
    return {k: v for k, v in items.items() if k not in host}, host


def checkpoint_bytes(s: Problem) -> int:
    """One block's checkpointed input, T·E·p (the residual stream in the weight dtype)."""
    return s.batch * s.seq_len * s.width * ELEMENT_BYTES[s.dtype]


def copy_seconds(link, efficiency: float, nbytes: float, copies: int) -> float:
    """`copies` copies of `nbytes` in all over the host link (bandwidth x the communication efficiency)."""
    return copies * link.latency_us * 1e-6 + nbytes / (link.bandwidth_gb_s * 1e9 * efficiency)


def transfers(s: Problem, t, profile, shard: float, compute: tuple[float, float], local: Problem) -> list[dict]:
    """The host copies of one step, each {name, bytes, seconds, exposed_s, overlap} (module docstring); `shard`:
    one device's 1/N of the weights' bytes, `compute`: (forward, backward) seconds the copies may hide under,
    `local`: the positions one device holds."""
    link, eff = profile.host.link, profile.efficiency.communication
    copies = []  # (name, bytes, copies, pass: 0 forward, 1 backward, None after the step, direction)
    if "activations" in t.offload:
        total = s.layers * checkpoint_bytes(local)
        copies += [("checkpointed inputs to the host", total, s.layers, 0, "out")]
        copies += [("checkpointed inputs back to the device", total, s.layers, 1, "in")]
    if "parameters" in t.offload:
        copies += [("parameter shard to the device (forward)", shard, s.layers, 0, "in")]
        copies += [("parameter shard to the device (backward)", shard, s.layers, 1, "in")]
        if "optimizer" not in t.offload:  # the device's step updated them: back to where they live
            copies += [("updated parameter shard to the host", shard, 1, None, "out")]
    if "optimizer" in t.offload:
        copies += [("gradient shard to the host", shard, s.layers, 1, "out")]
        if "parameters" not in t.offload:  # offloaded parameters are updated where they live
            copies += [("updated weight shard to the device", shard, 1, None, "in")]
    room = {(window, way): compute[window] for window in (0, 1) for way in ("in", "out")}
    out = []
    for name, nbytes, count, window, way in copies:
        seconds = copy_seconds(link, eff, nbytes, count)
        hidden = min(seconds, room.get((window, way), 0.0))
        room[(window, way)] = room.get((window, way), 0.0) - hidden
        overlap = ("under the forward", "under the backward")[window] if window is not None else "after the step"
        overlap += ", with the pass's other copies this way" if window is not None else ": exposed"
        out.append(dict(name=name, bytes=int(nbytes), seconds=seconds, exposed_s=seconds - hidden, overlap=overlap))
    return out


def host_step_seconds(profile, states, shard: float, devices_on_node: int) -> float:
    """ZeRO-Offload's CPU step: it reads and writes the states and the master copy (and offloaded parameters) on
    the host, reads the fp32 gradient partition and (parameters on the device) writes the updated weight shard for
    its copy back, at the node's host DRAM bandwidth x the memory efficiency, shared by the node's devices."""
    gradients = sum(v for k, v in states.host.items() if k.startswith(HOST_GRADIENTS))
    kept = sum(states.host.values()) - gradients
    written = 0 if any(k.startswith("parameters") for k in states.host) else shard
    rate = profile.host.memory_bandwidth_gb_s * 1e9 * profile.efficiency.memory_bandwidth / devices_on_node
    return (2 * kept + gradients + written) / rate


def host_bytes_per_node(s: Problem, t, states, local: Problem, devices_on_node: int) -> int:
    """What the node's host memory holds: each device's offloaded states and checkpointed inputs."""
    per_device = sum(states.host.values())
    if "activations" in t.offload:
        per_device += s.layers * checkpoint_bytes(local)  # pinned host buffers for every block's input
    return int(per_device * devices_on_node)
