"""``ModuleSpec`` / ``build_module`` / ``import_module`` / ``get_submodules`` (``transformer/spec_utils.py``).

Ports Megatron-LM's ``tests/unit_tests/transformer/test_spec_utils.py`` (every case: build from a function,
a type, an import path, with params, by call; the import errors; get_submodules of a spec, a partial, a
missing one) and the CPU half of ``tests/unit_tests/transformer/test_spec_customization.py::test_build_module``
(the all-identity ``TransformerLayerSubmodules`` passes its input through; ``get_bias_dropout_add`` built by
import path is the function itself). Its TE modules and the SelfAttention parameter count (648, TE's fused
layer norm included) are checked in ``test_gpt_model.py`` with the local modules (624).
"""

import dataclasses
from functools import partial

import pytest
from mega_par.fusions.fused_bias_dropout import get_bias_dropout_add
from mega_par.transformer.identity_op import IdentityFuncOp, IdentityOp
from mega_par.transformer.spec_utils import ModuleSpec, build_module, get_submodules, import_module
from mega_par.transformer.transformer_layer import TransformerLayerSubmodules


def dummy_method(x: int, y: str) -> dict:
    return {"x": x, "y": y}


class ExampleA:
    def __init__(self, x: int, y: str):
        self.x, self.y = x, y


def test_build_module_from_function():
    assert build_module(dummy_method) is dummy_method
    assert build_module(ModuleSpec(module=dummy_method)) is dummy_method


def test_build_module_from_type():
    class Empty:
        pass

    assert isinstance(build_module(Empty), Empty)
    assert isinstance(build_module(ModuleSpec(module=Empty)), Empty)


def test_build_module_by_import():
    built = build_module(ModuleSpec(module=("mega_par.transformer.identity_op", "IdentityOp")))
    assert type(built) is IdentityOp
    bda = build_module(ModuleSpec(module=("mega_par.fusions.fused_bias_dropout", "get_bias_dropout_add")))
    assert bda is get_bias_dropout_add  # a function named by path comes back uncalled


def test_build_module_with_params_and_call_arguments():
    built = build_module(ExampleA, 1, "abc")
    assert (built.x, built.y) == (1, "abc")
    by_spec = build_module(ModuleSpec(module=ExampleA, params={"x": 2, "y": "def"}))
    assert (by_spec.x, by_spec.y) == (2, "def")
    mixed = build_module(ModuleSpec(module=ExampleA, params={"y": "ghi"}), 3)
    assert (mixed.x, mixed.y) == (3, "ghi")
    called = ModuleSpec(module=ExampleA, params={"y": "jkl"})(4)
    assert (called.x, called.y) == (4, "jkl")


def test_build_module_passes_submodules_and_names_the_failing_class():
    @dataclasses.dataclass
    class Sub:
        x: object

    class WithSub:
        def __init__(self, z, submodules):
            self.z, self.inner = z, build_module(submodules.x, x=10, y="s")

    built = build_module(ModuleSpec(module=WithSub, submodules=Sub(x=ExampleA)), z=5)
    assert built.z == 5 and isinstance(built.inner, ExampleA) and built.inner.x == 10
    with pytest.raises(TypeError, match="when instantiating ExampleA"):
        build_module(ModuleSpec(module=ExampleA, params={"x": 1}), bogus=2)
    with pytest.raises(TypeError, match="expects a ModuleSpec"):
        build_module("not a spec")


def test_import_module_errors_name_module_and_spec():
    with pytest.raises(ImportError, match="Could not import module 'mega_par.models.does_not_exist'"):
        import_module(("mega_par.models.does_not_exist", "missing_spec"))
    with pytest.raises(ImportError, match="Could not find spec 'does_not_exist' in module "
                                          "'mega_par.transformer.identity_op'"):
        import_module(("mega_par.transformer.identity_op", "does_not_exist"))


def test_get_submodules():
    sub = TransformerLayerSubmodules()
    assert get_submodules(ModuleSpec(module=ExampleA, submodules=sub)) is sub
    assert get_submodules(partial(ExampleA, submodules=sub)) is sub
    with pytest.raises(ValueError, match="Could not find `submodules`"):
        get_submodules(ExampleA)


def test_identity_transformer_layer_submodules_pass_input_through():
    """Megatron's test_spec_customization: every default slot built alone is an identity."""
    x = 12
    for f in dataclasses.fields(TransformerLayerSubmodules):
        if f.name == "sharded_state_dict_keys_map":
            continue
        mod = build_module(getattr(TransformerLayerSubmodules(), f.name))
        x = mod()(x) if isinstance(mod, IdentityFuncOp) else mod(x)
    assert x == 12
    assert isinstance(build_module(IdentityFuncOp), IdentityOp)
