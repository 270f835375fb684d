"""flash_kernels.py on CPU: the one flash detection with stand-in packages (on sys.path and in sys.modules: only
flash_attn.cute, only FA2, both, neither), and FA4's argument plumbing through a stand-in `flash_attn.cute` that
computes attention with the math backend."""

import importlib.machinery
import sys
import types

import pytest
import torch

import dattn_cli.kernels.flash_kernels as fk
import dattn_cli.kernels.kernel_choice as kernel_choice
from dattn_cli.kernels.backends import BACKENDS, BlockCall


# --- flash detection ----------------------------------------------------------------------------------------------
@pytest.fixture
def no_flash_modules(monkeypatch):
    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        del sys.modules[name]


def _package(root, fa2: bool, fa4: bool):
    pkg = root / "flash_attn"
    if fa2 or fa4:
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
    if fa2:
        (pkg / "flash_attn_interface.py").write_text("def flash_attn_func(*a, **k): pass\n")
    if fa4:
        (pkg / "cute").mkdir()
        (pkg / "cute" / "__init__.py").write_text("def flash_attn_func(*a, **k): pass\n")


@pytest.mark.parametrize("fa2, fa4", [(False, True), (True, False), (True, True), (False, False)])
def test_flash_detection_tells_fa2_from_fa4_on_sys_path(tmp_path, monkeypatch, no_flash_modules, fa2, fa4):
    _package(tmp_path, fa2, fa4)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert fk.flash_installs() == fk.FlashInstall(fa2=fa2, fa4=fa4)
    from dattn_cli.runtime.envinfo import _backends

    found = _backends()
    assert (found["flash-attn 2"], found["flash-attn 4 (flash_attn.cute)"]) == (fa2, fa4)


def _module(name: str, package: bool) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        module.__path__ = []
    return module


@pytest.mark.parametrize("fa2, fa4", [(False, True), (True, False), (True, True), (False, False)])
def test_flash_detection_with_stand_in_modules(monkeypatch, no_flash_modules, fa2, fa4):
    if fa2 or fa4:
        monkeypatch.setitem(sys.modules, "flash_attn", _module("flash_attn", True))
    if fa2:
        monkeypatch.setitem(
            sys.modules, "flash_attn.flash_attn_interface", _module("flash_attn.flash_attn_interface", False)
        )
    if fa4:
        monkeypatch.setitem(sys.modules, "flash_attn.cute", _module("flash_attn.cute", True))
    assert fk.flash_installs() == fk.FlashInstall(fa2=fa2, fa4=fa4)


def test_a_broken_flash_package_is_not_installed(tmp_path, monkeypatch, no_flash_modules):
    (tmp_path / "flash_attn").mkdir()
    (tmp_path / "flash_attn" / "__init__.py").write_text("raise ImportError('no CUDA extension')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert fk.flash_installs() == fk.FlashInstall(fa2=False, fa4=False)


# --- FlashAttention-4's plumbing, through a stand-in flash_attn.cute computing with the math backend -----------------
class StandInFa4:
    """flash_attn.cute's entry points as the kernels call them, on (b, m, h, D), lse (b, h, m) fp32; they check
    what they are given and compute with the math backend."""

    def __init__(self):
        self.calls = []

    def _flash_attn_fwd(self, q, k, v, qv=None, softmax_scale=None, causal=False, return_lse=False, out=None):
        self.calls.append(("fwd", softmax_scale, causal, return_lse))
        call = BlockCall(causal=causal, scale=softmax_scale)
        o, lse = BACKENDS["math"].forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, call)
        return o.transpose(1, 2), lse.float(), None, None

    def _flash_attn_bwd(self, q, k, v, out, dout, lse, softmax_scale=None, causal=False, softcap=0.0):
        assert lse.dtype == torch.float32 and lse.is_contiguous() and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
        self.calls.append(("bwd", softmax_scale, causal))
        t = lambda x: x.transpose(1, 2)  # noqa: E731
        grads = BACKENDS["math"].backward(
            t(dout), t(q), t(k), t(v), t(out), lse, None, BlockCall(causal, softmax_scale)
        )
        return tuple(t(g) for g in grads)

    def flash_attn_func(self, q, k, v, softmax_scale=None, causal=False, return_lse=False):
        self.calls.append(("func", softmax_scale, causal, return_lse))
        return self._flash_attn_fwd(q, k, v, softmax_scale=softmax_scale, causal=causal, return_lse=True)[:2]


@pytest.fixture
def fa4_stand_in(monkeypatch, no_flash_modules):
    fa4 = StandInFa4()
    cute, interface = _module("flash_attn.cute", True), _module("flash_attn.cute.interface", False)
    cute.flash_attn_func = fa4.flash_attn_func
    interface._flash_attn_fwd, interface._flash_attn_bwd = fa4._flash_attn_fwd, fa4._flash_attn_bwd
    cute.interface = interface
    monkeypatch.setitem(sys.modules, "flash_attn", _module("flash_attn", True))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", interface)
    monkeypatch.delenv("DATTN_BLOCK_KERNEL", raising=False)
    monkeypatch.setattr(kernel_choice, "_CHOICE", {})  # no choice memoised by an earlier test
    return fa4


@pytest.mark.parametrize("causal", [False, True])
def test_flash_backend_runs_fa4_with_the_merged_out_and_lse(fa4_stand_in, causal):
    """The whole engine on the flash backend (only FA4 installed: no probe) equals the float64 reference, forward
    and gradients: FA4's layout, scale, causal flag and the merged (out, lse) reach its entry points right."""
    from dattn_cli.kernels import dilated_attention_reference
    from dattn_cli.kernels.engine import BlockAttention, ViewAccess, block_attention
    from dattn_cli.kernels.pattern import build_blocks

    segs, rates = [8, 16], [1, 2]
    base = [torch.randn(2, 40, 4, 8, dtype=torch.float64) for _ in range(4)]
    xs = [x.float().requires_grad_() for x in base[:3]]
    engine = BlockAttention(build_blocks(40, 4, segs, rates, "longnet"), ViewAccess(), "flash", BlockCall(causal, 0.3))
    out, _ = block_attention(*xs, None, engine)
    grads = torch.autograd.grad(out, xs, base[3].float())
    rs = [x.clone().requires_grad_() for x in base[:3]]
    ref, _ = dilated_attention_reference(*rs, segs, rates, causal, scale=0.3)
    ref_grads = torch.autograd.grad(ref, rs, base[3])
    for got, want in zip((out, *grads), (ref, *ref_grads)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    kinds = {c[0] for c in fa4_stand_in.calls}
    assert kinds == {"fwd", "bwd"} and all(c[1] == 0.3 and c[2] is causal for c in fa4_stand_in.calls)


def test_fa4_attention_returns_out_and_lse(fa4_stand_in):
    q, k, v = (torch.randn(2, 24, 3, 8) for _ in range(3))
    out, lse = fk.fa4_attention(q, k, v, causal=True, scale=0.5)
    assert fa4_stand_in.calls[0] == ("func", 0.5, True, True)
    ref, ref_lse = BACKENDS["math"].forward(*(x.transpose(1, 2) for x in (q, k, v)), None, BlockCall(True, 0.5))
    torch.testing.assert_close(out, ref.transpose(1, 2))
    torch.testing.assert_close(lse, ref_lse)
