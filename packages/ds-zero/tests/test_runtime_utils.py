"""``deepspeed.runtime.utils``' ``get_global_norm`` and ``ensure_directory_exists`` beside DeepSpeed's, in one
process; ``empty_cache`` asks the accelerator what DeepSpeed's asks it (free the cache, reset the peak)."""

import math

import pytest
import torch

pytest.importorskip("deepspeed")

import deepspeed.runtime.utils as theirs  # noqa: E402
import ds_zero.runtime.utils as ours  # noqa: E402


@pytest.mark.parametrize("norms", [[3.0, 4.0], [torch.tensor(3.0), 4.0, 12.0], [], [1.0, float("inf")],
                                   [float("nan"), 1.0], [2.0, -1.0]])
def test_get_global_norm_is_deepspeeds(norms):
    want, got = theirs.get_global_norm(norms), ours.get_global_norm(norms)
    assert math.isclose(float(got), float(want)) or (math.isinf(got) and math.isinf(want)), (got, want)


def test_ensure_directory_exists(tmp_path):
    for impl in (theirs, ours):
        target = tmp_path / impl.__name__ / "a" / "b" / "file.pt"
        impl.ensure_directory_exists(str(target))
        assert target.parent.is_dir() and not target.exists()
        impl.ensure_directory_exists(str(target))  # again: exists already, no error


def test_empty_cache_asks_the_accelerator_as_deepspeeds(monkeypatch):
    from ds_zero.accelerator import get_accelerator

    calls = []
    accel = get_accelerator()
    for name in ("empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(accel, name, lambda *a, n=name: calls.append(n))
    ours.empty_cache()
    assert calls == ["empty_cache", "reset_peak_memory_stats"]


def test_instrument_w_nvtx_brackets_each_call_with_a_named_range(monkeypatch):
    """Each call pushes a range named by the function's ``__qualname__`` and pops it after, as DeepSpeed's; the
    function's result and metadata are kept."""
    import deepspeed.utils
    import ds_zero.utils
    from ds_zero.accelerator import get_accelerator

    calls = []
    accel = get_accelerator()
    monkeypatch.setattr(accel, "range_push", lambda msg, **kw: calls.append(("push", msg, kw)))
    monkeypatch.setattr(accel, "range_pop", lambda **kw: calls.append(("pop", kw)))

    def add(a, b=1):
        """adds"""
        calls.append(("call", a, b))
        return a + b

    wrapped = ds_zero.utils.instrument_w_nvtx(add)
    assert wrapped(2, b=3) == 5 and wrapped.__doc__ == "adds"
    name = "test_instrument_w_nvtx_brackets_each_call_with_a_named_range.<locals>.add"
    assert calls == [("push", name, {}), ("call", 2, 3), ("pop", {})]
    assert deepspeed.utils.instrument_w_nvtx(add)(2) == wrapped(2)  # DeepSpeed's gives the same result
