"""``ModuleSpec`` / ``build_module``: a layer described as data (``megatron/core/transformer/spec_utils.py``).

A spec names a module class (or an ``(import path, name)`` pair imported on demand), constructor ``params``
and ``submodules`` (a dataclass of further specs the module builds itself). ``build_module`` calls the class
with the caller's arguments, then the spec's ``params``, then ``submodules=``; a plain function (such as
``get_bias_dropout_add``) is returned as it is, not called.
"""

from __future__ import annotations

import functools
import importlib
import types
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModuleSpec:
    """Megatron's ``ModuleSpec``: ``module`` (class, function or ``(module_path, name)``), ``params``,
    ``submodules``, ``metainfo``; calling a spec builds it."""

    module: tuple | type | types.FunctionType
    params: dict = field(default_factory=dict)
    submodules: object = None
    metainfo: dict = field(default_factory=dict)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return build_module(self, *args, **kwargs)


def import_module(module_path: tuple):
    """``("package.module", "Name")`` -> the object ``Name`` of that module."""
    if not (isinstance(module_path, tuple) and len(module_path) == 2):
        raise TypeError(f"a module path is a (module, name) tuple, got {module_path!r}")
    base_path, name = module_path
    try:
        module = importlib.import_module(base_path)
    except ImportError as exc:
        raise ImportError(f"Could not import module '{base_path}' for spec '{name}': {exc}") from exc
    try:
        return vars(module)[name]
    except KeyError as exc:
        raise ImportError(f"Could not find spec '{name}' in module '{base_path}'") from exc


def get_module(spec_or_module):
    """The class or function a spec names (importing it if it is given by path)."""
    if isinstance(spec_or_module, (type, types.FunctionType)):
        return spec_or_module
    if isinstance(spec_or_module.module, (type, types.FunctionType)):
        return spec_or_module.module
    return import_module(spec_or_module.module)


def build_module(spec_or_module, *args, **kwargs):
    """Instantiate a spec (or a bare class) with ``*args, **spec.params, **kwargs`` and its ``submodules``;
    functions, bare or inside a spec, come back uncalled."""
    if isinstance(spec_or_module, types.FunctionType):
        return spec_or_module
    if not isinstance(spec_or_module, (ModuleSpec, type)):
        raise TypeError(f"build_module expects a ModuleSpec, a class or a function, got {spec_or_module!r}")
    module = get_module(spec_or_module)
    if isinstance(module, types.FunctionType):
        return module
    if isinstance(spec_or_module, ModuleSpec):
        if spec_or_module.submodules is not None:
            kwargs["submodules"] = spec_or_module.submodules
        params = spec_or_module.params
    else:
        params = {}
    try:
        return module(*args, **params, **kwargs)
    except Exception as e:
        # the class name is hidden in the call above: say which module failed to build
        raise type(e)(f"{e} when instantiating {module.__name__}").with_traceback(e.__traceback__) from None


def get_submodules(spec) -> object:
    """The ``submodules`` of a spec, or of a ``functools.partial`` that binds them."""
    if isinstance(spec, functools.partial):
        return spec.keywords["submodules"]
    if hasattr(spec, "submodules"):
        return spec.submodules
    raise ValueError(f"Could not find `submodules` in the provided spec: {spec!r}")
