"""A toy implementation registered from outside dattn with one ImplSpec (loaded through DATTN_PLUGINS):
the improved kernel under its own name, so every command must find it through the registry alone."""

from dattn_cli.kernels import ImprovedDilatedAttention
from dattn_cli.kernels.registry import ImplSpec, register


class ToyDilatedAttention(ImprovedDilatedAttention):
    """ImprovedDilatedAttention under another name."""


register(
    ImplSpec(
        "ToyDilatedAttention",
        ToyDilatedAttention,
        "core",
        "single",
        "toy entry registered by tests/plugins/toy_attention.py",
    )
)
