"""``ds_zero.accelerator`` side by side with ``deepspeed.accelerator`` (DeepSpeed's
``accelerator/abstract_accelerator.py`` is the interface): every public method of DeepSpeed's interface exists here,
the cpu accelerator answers each as DeepSpeed's ``CPU_Accelerator`` does, the cuda one answers DeepSpeed's way on
the questions that need no device, and ``get_accelerator`` picks what DeepSpeed's picks (``DS_ACCELERATOR``, else
CUDA when a device is visible, else cpu)."""

import contextlib
import inspect
import re

import pytest
import torch

pytest.importorskip("deepspeed")

import deepspeed.accelerator.real_accelerator as ds_real  # noqa: E402
import ds_zero  # noqa: E402
from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator as DSAccelerator  # noqa: E402
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator as DSCPU  # noqa: E402
from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator as DSCUDA  # noqa: E402
from ds_zero._compat.accelerator import real_accelerator as ours_real  # noqa: E402
from ds_zero.accelerator import DeepSpeedAccelerator, get_accelerator  # noqa: E402
from ds_zero.accelerator.cpu_accelerator import CPU_Accelerator  # noqa: E402
from ds_zero.accelerator.cuda_accelerator import CUDA_Accelerator  # noqa: E402

PUBLIC = sorted(n for n in dir(DSAccelerator) if not n.startswith("_"))
MEMORY = {"memory_allocated", "max_memory_allocated", "memory_cached", "max_memory_cached", "memory_reserved",
          "max_memory_reserved", "available_memory"}
# methods that need arguments, and the arguments both get
ARGS = {"device_name": [(), (1,)], "device": [(), (0,)], "set_device": [(0,)], "synchronize": [(), (0,)],
        "default_generator": [(0,)], "stream": [(None,)], "current_stream": [()], "default_stream": [()],
        "range_push": [("x",)], "range_pop": [()], "lazy_call": [(lambda: 42,)], "on_accelerator": [(torch.ones(1),)],
        "capture_to_graph": [(None,)], "replay_graph": [(None,)], "get_op_builder": [("CPUAdamBuilder",)],
        "create_op_builder": [("CPUAdamBuilder",)], "set_visible_devices_envs": [({}, [0, 1])],
        "register_host_memory": [(0, 8)], "unregister_host_memory": [(0,)], "pin_memory": [(torch.ones(3),)],
        "pin_empty": [(2, 3)], "pin_empty_like": [(torch.ones(2, 2),)], "is_pinned": [(torch.ones(1),)],
        "unpin_memory": [(torch.ones(1),)], "manual_seed": [(5,)], "manual_seed_all": [(6,)],
        "set_compile_backend": [("inductor",)], "set_rng_state": [(torch.get_rng_state(),)]}
KWARGS = {"pin_empty": {"dtype": torch.float16}}


def _answer(accel, name, args):
    """What one call gave, in a form both libraries can be compared by."""
    attr = getattr(accel, name)
    value = attr(*args, **KWARGS.get(name, {})) if callable(attr) and not isinstance(attr, type) else attr
    if name in ("get_op_builder", "create_op_builder"):
        return (value if isinstance(value, type) else type(value)).__name__
    if name == "set_visible_devices_envs":
        return args[0]
    if isinstance(value, torch.Generator):
        return ("Generator", value.initial_seed())
    if isinstance(value, torch.Tensor):
        return ("Tensor", value.dtype, tuple(value.shape), value is args[0] if args else None)
    if isinstance(value, contextlib.AbstractContextManager) or hasattr(value, "__enter__"):
        with value as entered:
            return ("context", entered)
    return value


def test_every_public_method_of_deepspeeds_interface_exists_on_both_accelerators():
    assert len(PUBLIC) > 60  # the interface as DeepSpeed 0.19 defines it
    for cls in (CPU_Accelerator, CUDA_Accelerator):
        assert issubclass(cls, DeepSpeedAccelerator)
        missing = [n for n in PUBLIC if not hasattr(cls, n)]
        assert not missing, (cls.__name__, missing)
        assert not getattr(cls, "__abstractmethods__", None), (cls.__name__, cls.__abstractmethods__)
        cls()  # instantiable: nothing abstract left
        for name in PUBLIC:
            theirs = inspect.getattr_static(DSAccelerator, name)
            mine = inspect.getattr_static(cls, name)
            assert isinstance(mine, property) == isinstance(theirs, property), (cls.__name__, name)


def _missing_abstract(base, implemented: dict) -> set:
    """The methods Python's TypeError names when a subclass of ``base`` implements only ``implemented``."""
    cls = type("Partial_Accelerator", (base,), implemented)
    with pytest.raises(TypeError, match="Can't instantiate abstract class Partial_Accelerator") as info:
        cls()
    listed = str(info.value).split("abstract method", 1)[1].removeprefix("s")  # 3.11: a, b; 3.12: 'a', 'b'
    return set(re.findall(r"[A-Za-z_]\w*", listed))


def test_interface_is_abstract_where_deepspeeds_is_with_its_signatures():
    """DeepSpeed's docs ("Implement new accelerator extension") have a new device subclass DeepSpeedAccelerator;
    what it leaves out must fail at instantiation as under DeepSpeed, naming the same methods."""
    assert DeepSpeedAccelerator.__abstractmethods__ == DSAccelerator.__abstractmethods__
    assert len(DSAccelerator.__abstractmethods__) == 65
    for name in sorted(DSAccelerator.__abstractmethods__):
        theirs, mine = inspect.getattr_static(DSAccelerator, name), inspect.getattr_static(DeepSpeedAccelerator, name)
        if isinstance(theirs, property):
            assert isinstance(mine, property), name
        else:
            assert inspect.signature(mine) == inspect.signature(theirs), name
    half = {n: (lambda self, *a, **k: None) for n in sorted(DSAccelerator.__abstractmethods__)[::2]}
    names = _missing_abstract(DeepSpeedAccelerator, half)
    assert names == _missing_abstract(DSAccelerator, half) == DSAccelerator.__abstractmethods__ - set(half)
    assert _missing_abstract(DeepSpeedAccelerator, {}) == set(DSAccelerator.__abstractmethods__)


def test_a_complete_subclass_instantiates_and_can_be_set(fresh_choice):
    """A device implementing every abstract method (here each by a stub) instantiates under both libraries and
    ``set_accelerator`` takes it, as DeepSpeed's own does; DeepSpeed's test_abstract_methods_defined (each concrete
    class instantiable with its ``__init__`` stubbed) for ds_zero's two."""
    body = {n: (lambda self, *a, **k: None) for n in DSAccelerator.__abstractmethods__}
    body["device_name"] = lambda self, device_index=None: "mydev"
    mine = type("MyDev_Accelerator", (DeepSpeedAccelerator,), body)()
    type("MyDev_Accelerator", (DSAccelerator,), body)()
    assert mine.is_fp64_supported() and not mine.prefer_triton_grouped_mm()  # DeepSpeed's concrete defaults
    ours_real.set_accelerator(mine)
    assert get_accelerator() is mine and get_accelerator().device_name() == "mydev"
    assert not ours_real.is_current_accelerator_supported()
    with pytest.raises(AssertionError, match="not subclass of DeepSpeedAccelerator"):
        ours_real.set_accelerator(object())
    for cls in (CPU_Accelerator, CUDA_Accelerator):
        init = cls.__init__
        cls.__init__ = lambda self: None
        try:
            cls()
        finally:
            cls.__init__ = init


def test_cpu_accelerator_answers_each_method_as_deepspeeds():
    theirs, ours = DSCPU(), CPU_Accelerator()
    compared = 0
    for name in PUBLIC:
        for args in ARGS.get(name, [()]):
            a = _answer(theirs, name, args)
            torch.manual_seed(0)  # manual_seed / set_rng_state: both see the same generator state
            b = _answer(ours, name, args)
            if name in MEMORY:
                assert type(a) is type(b) and b == pytest.approx(a, rel=0.1), name
            elif name == "memory_stats":
                assert a.keys() == b.keys() and all(b[k] == pytest.approx(a[k], rel=0.1) for k in a)
            elif name == "op_builder_dir":
                assert a.startswith("deepspeed.ops.op_builder") and b == "ds_zero.ops.op_builder"
            else:
                assert a == b, (name, args, a, b)
            compared += 1
    assert compared >= len(PUBLIC)


def test_cpu_accelerator_refuses_ops_it_does_not_build_by_name():
    builder = CPU_Accelerator().create_op_builder("FusedLambBuilder")
    assert DSCPU().get_op_builder("FusedLambBuilder").__name__ == type(builder).__name__ == "NotImplementedBuilder"
    with pytest.raises(ValueError, match="FusedLambBuilder"):
        builder.load()
    assert CPU_Accelerator().create_op_builder("CPUAdamBuilder").NAME == "cpu_adam"
    with pytest.raises(ValueError, match="not_a_backend"):
        CPU_Accelerator().set_compile_backend("not_a_backend")


def test_cuda_accelerator_answers_deepspeeds_way_without_a_device():
    theirs, ours = DSCUDA(), CUDA_Accelerator()
    for name, args in [("device_name", ()), ("device_name", (3,)), ("device", (1,)), ("is_synchronized_device", ()),
                       ("use_host_timers", ()), ("communication_backend_name", ()), ("export_envs", ()),
                       ("visible_devices_envs", ()), ("is_available", ()), ("on_accelerator", (torch.ones(1),)),
                       ("supported_dtypes", ()), ("get_compile_backend", ()), ("supports_nvtx_domain", None),
                       ("pin_memory_alignment", ())]:
        a, b = getattr(theirs, name), getattr(ours, name)
        if args is not None:
            a, b = a(*args), b(*args)
        assert a == b, (name, a, b)
    if torch.cuda.is_available():
        for name in ("is_bf16_supported", "is_fp16_supported", "device_count", "current_device_name",
                     "is_triton_supported"):
            assert getattr(ours, name)() == getattr(theirs, name)(), name
    else:
        assert ours.is_bf16_supported() == theirs.is_bf16_supported() is True
        assert ours.is_fp16_supported() == theirs.is_fp16_supported() is True
    assert ours.Stream is torch.cuda.Stream and ours.Event is torch.cuda.Event


@pytest.fixture
def fresh_choice(monkeypatch):
    """Both libraries choose again (their choice is process-wide and cached)."""
    monkeypatch.setattr(ds_real, "ds_accelerator", None)
    monkeypatch.setattr(ours_real, "ds_accelerator", None)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    return monkeypatch


def _choose(monkeypatch):
    monkeypatch.setattr(ds_real, "ds_accelerator", None)
    monkeypatch.setattr(ours_real, "ds_accelerator", None)
    results = []
    for choose in (ds_real.get_accelerator, get_accelerator):
        try:
            results.append(choose()._name)
        except ValueError as e:
            results.append(("ValueError", str(e)))
    return results


def test_get_accelerator_chooses_as_deepspeed(fresh_choice):
    mp = fresh_choice
    if not torch.cuda.is_available():
        assert _choose(mp) == ["cpu", "cpu"]
    for name in ("cpu", "cuda"):
        mp.setenv("DS_ACCELERATOR", name)
        assert _choose(mp) == [name, name]
    mp.setenv("DS_ACCELERATOR", "tpu")
    theirs, mine = _choose(mp)
    assert theirs == mine and theirs[0] == "ValueError" and "tpu" in theirs[1]
    mp.delenv("DS_ACCELERATOR")
    mp.setattr(torch.cuda, "device_count", lambda: 1)  # a visible CUDA device: both pick cuda
    mp.setattr(torch.cuda, "is_available", lambda: True)
    assert _choose(mp) == ["cuda", "cuda"]
    assert ds_zero.get_accelerator() is get_accelerator()  # chosen once, cached
    assert ds_zero.accelerator.is_current_accelerator_supported()


def test_an_accelerator_ds_zero_does_not_build_is_refused_by_name(fresh_choice):
    fresh_choice.setenv("DS_ACCELERATOR", "hpu")
    with pytest.raises(ValueError, match="hpu"):
        get_accelerator()
    with pytest.raises(AssertionError, match="not subclass"):
        ds_zero.accelerator.set_accelerator(object())
    ds_zero.accelerator.set_accelerator(CPU_Accelerator())
    assert get_accelerator().device_name() == "cpu"
