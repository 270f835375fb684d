"""`dattn impls`: the registry: every implementation and baseline, where it runs, whether it can run here."""

from __future__ import annotations

from .options import JsonOption
from .render.common import emit_json, stdout
from .render.env import impls_table

# the spec's own fields a record repeats as they are
FLAGS = ("name", "kind", "strategy", "baseline", "block_sparse", "distributed", "single_device")


def availability(spec) -> dict:
    """The devices `spec` can run on here, or why it runs nowhere here (the reason for its own devices, e.g.
    a cuda-only entry's missing package and its install hint, not merely 'not cpu')."""
    reasons = {device: spec.unavailable(device) for device in spec.devices}
    usable = [device for device, reason in reasons.items() if reason is None]
    return {
        "available": bool(usable),
        "available_on": usable,
        "unavailable": None if usable else "; ".join(f"{device}: {reason}" for device, reason in reasons.items()),
    }


def record(spec, kernels: dict[str, str] | None = None) -> dict:
    """The registry entry as JSON; `kernels`: what each backend's blocks run on here (block_kernels)."""
    kernels = kernels or {}
    return {
        **{key: getattr(spec, key) for key in FLAGS},
        "backends": list(spec.backends),
        "block_kernels": {b: kernels[b] for b in spec.backends if b in kernels},
        "devices": list(spec.devices),
        "where": spec.where(),
        "summary": spec.summary,
        "requires": list(spec.requires),
        **availability(spec),
    }


def impls(json_out: JsonOption = None) -> None:
    """The registry: name, kind, strategy, baseline, backends, where it runs, and whether it runs here (and why not)."""
    import torch

    from ..kernels.kernel_choice import expected_kernels
    from ..kernels.registry import REGISTRY

    kernels = expected_kernels(torch.cuda.is_available())
    entries = [record(spec, kernels) for spec in REGISTRY.values()]
    if json_out != "-":
        stdout.print(impls_table(entries, kernels))
    if json_out:
        emit_json(json_out, entries)
