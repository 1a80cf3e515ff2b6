"""``HfArgumentParser``: dataclass fields -> an argparse CLI (``--help`` shows each field's ``help`` and default),
or a dict / JSON file straight into the dataclasses (transformers' ``hf_argparser.py``)."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import sys
import types
import typing
from argparse import ArgumentDefaultsHelpFormatter, ArgumentParser, ArgumentTypeError
from collections.abc import Iterable


def string_to_bool(v):
    if isinstance(v, bool):
        return v
    if v.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if v.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise ArgumentTypeError(f"Truthy value expected: got {v} but expected one of yes/no, true/false, t/f, y/n, 1/0")


def _strip_optional(tp):
    """``X | None`` -> X; a union with ``str`` in it (``dict | str | None``) -> str: the CLI passes text."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or isinstance(tp, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
        if str in args:
            return str
        raise ValueError(f"Only `Optional[X]` or unions containing str are supported, got {tp}")
    return tp


class HfArgumentParser(ArgumentParser):
    """An ``ArgumentParser`` whose arguments are the fields of ``dataclass_types``, in order."""

    def __init__(self, dataclass_types=None, **kwargs):
        kwargs.setdefault("formatter_class", ArgumentDefaultsHelpFormatter)
        super().__init__(**kwargs)
        if dataclass_types is None:
            dataclass_types = []
        elif dataclasses.is_dataclass(dataclass_types) or not isinstance(dataclass_types, Iterable):
            dataclass_types = [dataclass_types]
        self.dataclass_types = list(dataclass_types)
        for dtype in self.dataclass_types:
            self._add_dataclass_arguments(dtype)

    def _add_dataclass_arguments(self, dtype) -> None:
        group = self.add_argument_group(dtype._argument_group_name) if hasattr(dtype, "_argument_group_name") else self
        hints = typing.get_type_hints(dtype)
        for f in dataclasses.fields(dtype):
            if f.init:
                self._add_field(group, f, hints[f.name])

    @staticmethod
    def _add_field(parser, f: dataclasses.Field, annotation) -> None:
        names = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        kwargs = {k: v for k, v in f.metadata.items() if k != "aliases"}
        aliases = f.metadata.get("aliases", [])
        aliases = [aliases] if isinstance(aliases, str) else list(aliases)
        tp = _strip_optional(annotation)
        origin = typing.get_origin(tp)
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if origin is typing.Literal or (isinstance(tp, type) and issubclass(tp, enum.Enum)):
            choices = list(typing.get_args(tp)) if origin is typing.Literal else [m.value for m in tp]
            by_text = {str(c): c for c in choices}
            kwargs.update(choices=choices, type=lambda text: by_text.get(text, text))
        elif tp is bool:
            # `--flag`, `--flag false`; a True default also gets `--no_flag`.
            kwargs.update(type=string_to_bool, nargs="?", const=True)
            default = False if default is dataclasses.MISSING else default
            has_default = True
        elif origin is list:
            kwargs.update(type=typing.get_args(tp)[0] if typing.get_args(tp) else str, nargs="+")
        else:
            kwargs["type"] = tp
        if has_default:
            kwargs["default"] = default
        else:
            kwargs["required"] = True
        parser.add_argument(*names, *aliases, **kwargs)
        if tp is bool and default is True:
            parser.add_argument(
                f"--no_{f.name}",
                f"--no-{f.name.replace('_', '-')}",
                action="store_false",
                dest=f.name,
                help=f"Sets {f.name} to False.",
            )

    def _to_dataclasses(self, values: dict) -> list:
        outputs = []
        for dtype in self.dataclass_types:
            keys = {f.name for f in dataclasses.fields(dtype) if f.init}
            outputs.append(dtype(**{k: v for k, v in values.items() if k in keys}))
        return outputs

    def parse_args_into_dataclasses(
        self,
        args=None,
        return_remaining_strings=False,
        look_for_args_file=True,
        args_filename=None,
        args_file_flag=None,
    ):
        """Parse the command line (``sys.argv[1:]`` by default) into one instance per dataclass.

        As in transformers, a ``<script>.args`` file beside the entry point (or ``args_filename``, or files named by
        ``args_file_flag``) is read first, so the command line overrides it. Unknown arguments raise unless
        ``return_remaining_strings``."""
        files = []
        if args_filename:
            files.append(args_filename)
        elif look_for_args_file and sys.argv and sys.argv[0]:
            files.append(os.path.splitext(sys.argv[0])[0] + ".args")
        if args_file_flag:
            flag_parser = ArgumentParser(add_help=False)
            flag_parser.add_argument(args_file_flag, type=str, action="append")
            cfg, args = flag_parser.parse_known_args(args=args)
            files += getattr(cfg, args_file_flag.lstrip("-").replace("-", "_")) or []
        file_args = []
        for path in files:
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as fh:
                    file_args += fh.read().split()
        args = file_args + (list(args) if args is not None else sys.argv[1:])
        namespace, remaining = self.parse_known_args(args=args)
        values = vars(namespace)
        outputs = self._to_dataclasses(values)
        used = {f.name for d in self.dataclass_types for f in dataclasses.fields(d) if f.init}
        extra = {k: v for k, v in values.items() if k not in used}
        if extra:  # arguments added to the parser by hand come back as a namespace, as in transformers
            outputs.append(type(namespace)(**extra))
        if return_remaining_strings:
            return (*outputs, remaining)
        if remaining:
            raise ValueError(f"Some specified arguments are not used by the HfArgumentParser: {remaining}")
        return tuple(outputs)

    def parse_dict(self, args: dict, allow_extra_keys: bool = False) -> tuple:
        """The dataclasses from a dict, without argparse; unknown keys raise unless ``allow_extra_keys``."""
        known = {f.name for d in self.dataclass_types for f in dataclasses.fields(d) if f.init}
        unused = sorted(set(args) - known)
        if unused and not allow_extra_keys:
            raise ValueError(f"Some keys are not used by the HfArgumentParser: {unused}")
        return tuple(self._to_dataclasses(args))

    def _parse_file(self, path, load, what: str, allow_extra_keys: bool) -> tuple:
        with open(path, encoding="utf-8") as fh:
            data = load(fh)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a {what} of argument names, got {type(data).__name__}")
        return self.parse_dict(data, allow_extra_keys=allow_extra_keys)

    def parse_json_file(self, json_file: str | os.PathLike, allow_extra_keys: bool = False) -> tuple:
        return self._parse_file(json_file, json.load, "JSON object", allow_extra_keys)

    def parse_yaml_file(self, yaml_file: str | os.PathLike, allow_extra_keys: bool = False) -> tuple:
        """The dataclasses from a YAML mapping of argument names (as ``parse_json_file``)."""
        import yaml

        return self._parse_file(yaml_file, yaml.safe_load, "YAML mapping", allow_extra_keys)
