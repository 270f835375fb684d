"""dattn's whole-model plan (plan/parallel.py) side by side with llm-analysis's training analysis.

llm-analysis (github.com/cli99/llm-analysis, commit d841e40) is not a dependency: the formulas used here are
re-implemented from llm_analysis/analysis.py, each function named after the method it follows
(LLMAnalysis.<method>), with its defaults: dtype w16a16e16 (weights, activations, embedding 16-bit), FP32
master weights and Adam (other_op_bytes None: 4 + 2·4 bytes per parameter), layernorm_dtype_bytes 4,
flash_attn True, softmax_dropout False, attn_dropout True (get_activation_memory_per_layer_attn's default),
fwd_prefetch and bwd_prefetch True, tp = pp = ep = 1, sp = tp. Its dp_size is the sharded data-parallel size
(ZeRO/FSDP), so a DDP run is ds_zero NONE with dp_size N. Efficiencies: llm-analysis's flops_efficiency,
hbm_memory_efficiency and intra/inter-node efficiencies are set to the ones dattn used (the profile's), so the
time columns differ by model, not by assumption.

    python benchmarks/llm_analysis_compare.py

Prints one table per configuration (GiB per device, ms per step) and the relative difference.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dattn_cli.plan import solve  # noqa: E402
from dattn_cli.plan.layers import ModelStates, layer_memory, matmul_key, model_parameters  # noqa: E402
from dattn_cli.plan.parallel import Training, model_states  # noqa: E402
from dattn_cli.plan.profiles import HardwareProfile, load_profile  # noqa: E402
from dattn_cli.workload import Problem  # noqa: E402

GIB = 2**30


@dataclass
class Config:
    name: str
    layers: int
    width: int
    heads: int
    seq_len: int
    profile: str
    devices: int
    zero: int
    checkpointing: bool = False
    vocab: int = 50304
    batch: int = 1


CONFIGS = [
    Config("1.3B (24 x 2048, 16 heads), N=2048, 1 x A100 80GB", 24, 2048, 16, 2048, "a100-sxm-80gb", 1, 0),
    Config("7B (32 x 4096, 32 heads), N=4096, ZeRO-3 over 8 x H100", 32, 4096, 32, 4096, "h100-sxm-80gb", 8, 3),
    Config(
        "13B (40 x 5120, 40 heads), N=2048, tp 1, dp 8 ZeRO-2, full recompute, A100 80GB",
        40,
        5120,
        40,
        2048,
        "a100-sxm-80gb",
        8,
        2,
        checkpointing=True,
    ),
    Config("7B (32 x 4096, 32 heads), N=4096, DDP over 8 x H100", 32, 4096, 32, 4096, "h100-sxm-80gb", 8, 0),
]


class LLMAnalysis:
    """The training formulas of llm_analysis/analysis.py (LLMAnalysis), tp = pp = 1, dense MHA, GELU MLP (x4)."""

    def __init__(self, c: Config, profile: HardwareProfile, flops_efficiency: float):
        self.c, self.E, self.V, self.F = c, c.width, c.vocab, 4 * c.width
        self.dp = c.devices
        self.zero = c.zero
        self.tflops = profile.peak_tflops.bfloat16 * flops_efficiency  # get_TFLOPS_per_gpu (16-bit gemm)
        self.hbm = profile.memory_bandwidth_gb_s * profile.efficiency.memory_bandwidth  # get_gpu_hbm_bandwidth
        link = profile.intra_node if self.dp <= 8 else profile.inter_node  # dp*tp <= 8: intra-node
        self.link = link.bandwidth_gb_s * profile.efficiency.communication

    # parameters: get_num_params_per_layer_attn/mlp/layernorm, get_num_params_embedding, ..._last_layernorm
    def params_layer(self) -> int:
        return 4 * self.E**2 + 2 * self.E * self.F + 2 * self.E

    def params_total(self) -> int:  # get_num_params_total
        return self.c.layers * self.params_layer() + self.V * self.E + self.E

    def weights(self) -> float:  # get_weight_memory_per_layer, get_memory_embedding, ..._last_layernorm (2 bytes)
        return 2 * self.params_total() / (self.dp if self.zero == 3 else 1)

    def optimizer_states(self) -> float:  # get_memory_optimizer_state_and_gradient_*: (4 + 8) bytes, /dp from ZeRO-1
        return 12 * self.params_total() / (self.dp if self.zero >= 1 else 1)

    def gradients(self) -> float:  # same methods: master_weights_dtype_bytes (4) per parameter, /dp from ZeRO-2
        return 4 * self.params_total() / (self.dp if self.zero >= 2 else 1)

    def activations(self) -> float:
        """get_activation_memory_per_layer (x layers) + input embedding + output embedding (logits) + last LN."""
        T, E, H = self.c.batch * self.c.seq_len, self.E, self.c.heads
        if self.c.checkpointing:  # ActivationRecomputation.FULL: the layer input, 2 bytes
            per_layer = 2 * T * E
        else:
            attn = (T * E + 4 * T * E) * 2 + (2 * T * E + 4 * H * T) * 2 + T * E  # ..._attn, flash, dropout mask
            mlp = 2 * T * E + (2 + 2) * 4 * T * E  # ..._mlp: fc1 input, GELU input, fc2 input
            per_layer = attn + mlp + 2 * 4 * T * E  # two LayerNorm inputs in fp32
        return per_layer * self.c.layers + 2 * T * E + self.logits() + 4 * T * E

    def logits(self) -> float:  # get_activation_memory_output_embedding = get_loss_bwd_memory
        return 2 * self.c.batch * self.c.seq_len * self.V

    def prefetch(self) -> float:  # training(): max(fwd prefetch (embedding + layer), bwd prefetch 2 layers)
        return max(2 * self.V * self.E + 2 * self.params_layer(), 2 * 2 * self.params_layer())

    def peak(self) -> float:
        """training(): estimated_peak_memory_per_gpu = op_state + weights + max(activations, gradients)
        + max(bwd prefetch, loss_bwd_memory); the logits are in the activations and again in loss_bwd_memory."""
        bwd_prefetch = 2 * 2 * self.params_layer()
        return (
            self.optimizer_states()
            + self.weights()
            + max(self.activations(), self.gradients())
            + max(bwd_prefetch, self.logits())
        )

    def step_ms(self) -> float:
        """training(): latency_per_iter = 3 x latency_fwd + recompute + weight update (no DDP all-reduce in it)."""
        c, T, E = self.c, self.c.batch * self.c.seq_len, self.E
        flops_layer = 8 * T * E**2 + 4 * T * c.seq_len * E + 16 * T * E**2  # get_num_flops_fwd_per_layer_attn + mlp
        compute = flops_layer / (self.tflops * 1e12)  # attn and mlp latencies are compute-bound here
        layernorm = 2 * max(5 * T * E / (self.tflops * 1e12), T * E * 4 / (self.hbm * 1e9))
        allgather = 2 * self.params_layer() * (self.dp - 1) / self.dp / (self.link * 1e9)  # ..._shared_dp_comm
        layer = max(compute + layernorm, allgather)
        fwd = layer * c.layers + self.V * E * 2 / (self.hbm * 1e9) + 2 * T * self.V * E / (self.tflops * 1e12)
        recompute = c.layers * (compute + layernorm) if c.checkpointing else 0.0
        update = (self.weights() + self.optimizer_states() + self.gradients()) / (self.hbm * 1e9)
        return (3 * fwd + recompute + update) * 1e3


def dattn_figures(c: Config, profile: HardwareProfile) -> tuple[dict[str, float], float]:
    s = Problem(
        impl="ImprovedMultiheadDilatedAttention",
        target="model",
        layers=c.layers,
        embed_dim=c.width,
        heads=c.heads,
        seq_len=c.seq_len,
        batch=c.batch,
        vocab_size=c.vocab,
        dtype="bfloat16",
        mode="fwdbwd",
        segment_lengths=[c.seq_len],
        dilation_rates=[1],
        checkpointing=c.checkpointing,
    )
    training = Training(devices=c.devices, zero=c.zero)
    result = solve.plan(s, profile, training=training)
    states = model_states(s, training)
    items = result.memory.items

    def pick(prefix: str, where: dict) -> float:
        return sum(v for k, v in where.items() if k.startswith(prefix))

    # activations at their own peak phase: the same phases with no weights, gradients or optimizer
    alone = layer_memory(s, 0, "cuda", ModelStates({}))
    activations = alone.total
    figures = {
        "parameters (count, 1e9)": model_parameters(s) / 1e9 * GIB,
        "weights": pick("parameters", states.resident),
        "optimizer states + fp32 master": pick("optimizer states", states.resident)
        + pick("fp32 master", states.resident),
        "gradients": pick("gradients", states.step),
        "activations (logits included)": activations,
        "logits / loss": pick("log-softmax", alone.items),
        "FSDP gathered units": pick("all-gathered", items),
        "DDP buckets": pick("DDP", items),
        "optimizer step temporaries": pick("optimizer temporary", states.step),
        "peak per device": result.memory.total - pick("framework", items),
    }
    return figures, result.time.total_s * 1e3


def compare(c: Config) -> list[tuple[str, float, float]]:
    profile = load_profile(c.profile)
    ours, ms = dattn_figures(c, profile)
    la = LLMAnalysis(
        c,
        profile,
        profile.efficiency.compute_for(
            matmul_key(Problem(impl="ImprovedMultiheadDilatedAttention", target="model", dtype="bfloat16")), "fwdbwd"
        ),
    )
    theirs = {
        "parameters (count, 1e9)": la.params_total() / 1e9 * GIB,
        "weights": la.weights(),
        "optimizer states + fp32 master": la.optimizer_states(),
        "gradients": la.gradients(),
        "activations (logits included)": la.activations(),
        "logits / loss": 2 * la.logits(),
        "FSDP gathered units": la.prefetch() if c.zero == 3 else 0.0,
        "DDP buckets": 0.0,
        "optimizer step temporaries": 0.0,
        "peak per device": la.peak(),
    }
    rows = [(k, ours[k] / GIB, theirs[k] / GIB) for k in ours]
    return rows + [("time per step (ms)", ms, la.step_ms())]


def main() -> None:
    print(
        "dattn plan (plan/parallel.py) vs llm-analysis formulas (llm_analysis/analysis.py @ d841e40); "
        "GiB per device (framework overhead excluded) unless stated"
    )
    for c in CONFIGS:
        print(f"\n{c.name}")
        print(f"| {'item':<34} | {'dattn':>10} | {'llm-analysis':>12} | {'diff':>7} |")
        print(f"|{'-' * 36}|{'-' * 12}:|{'-' * 14}:|{'-' * 8}:|")
        for name, ours, theirs in compare(c):
            diff = f"{100 * (ours - theirs) / theirs:+.0f}%" if theirs else ("-" if not ours else "n/a")
            print(f"| {name:<34} | {ours:>10.2f} | {theirs:>12.2f} | {diff:>7} |")


if __name__ == "__main__":
    main()
