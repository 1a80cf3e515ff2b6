"""``deepspeed.OnDevice`` (also ``deepspeed.utils.OnDevice``), ``deepspeed.PipelineEngine`` at the top level and
``deepspeed.runtime.zero``'s ZeRO-3 helpers, side by side with DeepSpeed in one
process: modules built under ``OnDevice`` have DeepSpeed's devices and dtypes, and everything is as before after the
block. On ``meta`` ds_zero's alone: DeepSpeed 0.19's constructor patching fails there under this torch
(``TypeError: unsupported operand type(s) for *: 'int' and 'Tensor'`` in ``nn.Linear``'s init)."""

import pytest
import torch

pytest.importorskip("deepspeed")

import deepspeed  # noqa: E402
import ds_zero  # noqa: E402


def _build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Embedding(5, 3))


def _layout(module):
    return [(n, t.device.type, t.dtype, tuple(t.shape)) for n, t in module.state_dict().items()]


@pytest.mark.parametrize("dtype, device", [(torch.float16, "cpu"), (torch.bfloat16, "cpu"), (torch.float64, "meta")])
def test_on_device_builds_what_deepspeeds_builds(dtype, device):
    with ds_zero.OnDevice(dtype=dtype, device=device):
        ours = _build()
    if device == "meta":
        assert {t.device.type for t in ours.state_dict().values()} == {"meta"}
    else:
        with deepspeed.OnDevice(dtype=dtype, device=device):
            theirs = _build()
        assert _layout(ours) == _layout(theirs)
        for name, t in theirs.state_dict().items():
            assert torch.equal(ours.state_dict()[name], t), name  # the same draws, cast as DeepSpeed casts
    assert {t.dtype for t in ours.state_dict().values()} == {dtype}  # the check can fail: fp32 otherwise
    assert torch.get_default_dtype() == torch.float32 and torch.empty(1).device.type == "cpu"
    with ds_zero.OnDevice(dtype=dtype, device=device, enabled=False):
        assert _layout(_build()) == _layout(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3),
                                                                 torch.nn.Embedding(5, 3)))
    with pytest.raises(ValueError, match="floating-point torch.dtype, got torch.int64"):
        ds_zero.OnDevice(dtype=torch.int64)


def test_top_level_names():
    """``OnDevice`` where DeepSpeed has it (top level, ``deepspeed.utils``); ``deepspeed.runtime.zero``'s
    ``GatheredParameters`` and ``ZeroParamStatus`` are ``deepspeed.zero``'s."""
    import deepspeed.runtime.zero as theirs_zero
    import deepspeed.utils
    import ds_zero.runtime.zero as ours_zero
    import ds_zero.utils

    assert ds_zero.utils.OnDevice is ds_zero.OnDevice and deepspeed.utils.OnDevice is deepspeed.OnDevice
    for name in ("GatheredParameters", "ZeroParamStatus"):
        assert getattr(ours_zero, name) is getattr(ds_zero.zero, name)
        assert getattr(theirs_zero, name) is getattr(deepspeed.zero, name)
    assert issubclass(ds_zero.PipelineEngine, ds_zero.DeepSpeedEngine.__mro__[1])  # the engine API both share
