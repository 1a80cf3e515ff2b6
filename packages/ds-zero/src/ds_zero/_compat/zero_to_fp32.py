"""Consolidate a ZeRO checkpoint (any stage, any world size) into one fp32 state dict.

DeepSpeed's ``zero_to_fp32.py``: read every rank's fp32 master partition and stitch the parameters
back together from the partition layout recorded in the checkpoint, then add the module's buffers.
CLI (and the ``zero_to_fp32.py`` that ``save_checkpoint`` leaves beside the tags): ``CHECKPOINT_DIR OUTPUT_DIR
[--safe_serialization] [--max_shard_size 5GB] [-t TAG]`` writes ``pytorch_model.bin`` (or ``model.safetensors``),
sharded with an index past ``max_shard_size``, as DeepSpeed's.
"""

from __future__ import annotations

import argparse
import json
import logging
import os

import torch

from ds_zero._compat.checkpoint import LATEST, find_model_file, optim_file, resolve_tag_dir

logger = logging.getLogger(__name__)


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, exclude_frozen_parameters: bool = False,
                                             lazy_mode: bool = False) -> dict[str, torch.Tensor]:
    """The full fp32 state dict of the checkpoint under ``checkpoint_dir`` (tag from ``latest`` unless given).
    ``lazy_mode`` is accepted for DeepSpeed's signature; the tensors are real (``.contiguous()`` works on them)."""
    if tag is None and not os.path.isfile(os.path.join(str(checkpoint_dir), LATEST)):
        raise ValueError(f"Unable to find 'latest' file at {os.path.join(str(checkpoint_dir), LATEST)}")
    path = resolve_tag_dir(checkpoint_dir, tag)
    states = torch.load(find_model_file(path), map_location="cpu", weights_only=False)
    layout = states["layout"]
    count = layout["partition_count"]
    masters = [torch.load(os.path.join(path, optim_file(r)), map_location="cpu", weights_only=False)
               ["master_partitions"] for r in range(count)]
    out: dict[str, torch.Tensor] = {}
    for g, (names, shapes, numels) in enumerate(zip(states["param_names"], states["param_shapes"],
                                                    layout["numels"])):
        if layout["kind"] == "flat":
            flat = torch.cat([m[g] for m in masters])
            off = 0
            for name, shape, n in zip(names, shapes, numels):
                out[name] = flat[off:off + n].view(shape).clone()
                off += n
        else:
            off = 0
            for name, shape, n, c in zip(names, shapes, numels, layout["chunks"][g]):
                full = torch.cat([m[g][off:off + c] for m in masters])[:n]
                out[name] = full.view(shape).clone()
                off += c
    frozen = set(states.get("frozen_param_names", ())) if exclude_frozen_parameters else set()
    for name, t in states["module"].items():
        if name not in out and name not in frozen:
            out[name] = t.float().clone() if t.is_floating_point() else t.clone()
    return out


_SIZE_UNITS = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}


def _shard_bytes(max_shard_size) -> int:
    """``"5GB"`` / ``"500MB"`` / an int: bytes, as Hugging Face's ``parse_size_to_int`` reads them."""
    if isinstance(max_shard_size, int):
        return max_shard_size
    size = str(max_shard_size).strip()
    if size[-2:].upper() not in _SIZE_UNITS:
        raise ValueError(f"Unit '{size[-2:]}' not supported. Supported units are TB, GB, MB, KB. Got '{size}'.")
    return int(float(size[:-2].strip()) * _SIZE_UNITS[size[-2:].upper()])


def _shards(sd: dict[str, torch.Tensor], limit: int) -> list[list[str]]:
    """Hugging Face's ``split_state_dict_into_shards``: tensors in order into the open shard, a new one when the
    next would pass ``limit`` bytes; a tensor past ``limit`` alone in a shard of its own."""
    shards, current, size = [], [], 0
    for name, t in sd.items():
        n = t.numel() * t.element_size()
        if n > limit:
            shards.append([name])
            continue
        if size + n > limit:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += n
    return shards + [current] if current else shards


OUTPUT_DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
                      "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def _resolve_output_dtype(dtype) -> torch.dtype:
    resolved = dtype
    if isinstance(dtype, str):
        resolved = OUTPUT_DTYPE_NAMES.get(dtype.removeprefix("torch.").lower())
    if resolved not in OUTPUT_DTYPE_NAMES.values():
        raise ValueError(f"Unsupported output dtype {dtype!r}. Choose one of: {', '.join(sorted(OUTPUT_DTYPE_NAMES))}")
    return resolved


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size="5GB",
                                               safe_serialization: bool = False, tag=None,
                                               exclude_frozen_parameters: bool = False) -> dict[str, torch.Tensor]:
    """:func:`convert_zero_checkpoint_to_state_dict` in fp32."""
    return convert_zero_checkpoint_to_state_dict(checkpoint_dir, output_dir, torch.float32, max_shard_size,
                                                 safe_serialization, tag, exclude_frozen_parameters)


def convert_zero_checkpoint_to_state_dict(checkpoint_dir, output_dir, dtype=torch.float32, max_shard_size="5GB",
                                          safe_serialization: bool = False, tag=None,
                                          exclude_frozen_parameters: bool = False) -> dict[str, torch.Tensor]:
    """Write the state dict into ``output_dir`` (floating-point tensors in ``dtype``): ``pytorch_model.bin``
    (``model.safetensors`` with ``safe_serialization``), or shards ``pytorch_model-0000k-of-0000n.bin`` and a
    ``.index.json`` weight map past ``max_shard_size`` (``None``: one file). Returns the state dict."""
    dtype = _resolve_output_dtype(dtype)
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
    weights = "model.safetensors" if safe_serialization else "pytorch_model.bin"
    shards = [list(sd)] if max_shard_size is None else _shards(sd, _shard_bytes(max_shard_size))
    stem, ext = os.path.splitext(weights)
    names = [weights] if len(shards) == 1 else [f"{stem}-{k + 1:05d}-of-{len(shards):05d}{ext}"
                                                 for k in range(len(shards))]
    os.makedirs(output_dir, exist_ok=True)
    for file, keys in zip(names, shards):
        part = {k: sd[k].contiguous() for k in keys}
        dst = os.path.join(output_dir, file)
        tmp = f"{dst}.tmp{os.getpid()}"
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(part, tmp, metadata={"format": "pt"})
        else:
            torch.save(part, tmp)
        os.replace(tmp, dst)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in sd.values())},
                 "weight_map": {k: file for file, keys in zip(names, shards) for k in keys}}
        with open(os.path.join(output_dir, f"{weights}.index.json"), "w") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return sd


def load_state_dict_from_zero_checkpoint(model: torch.nn.Module, checkpoint_dir, tag=None) -> torch.nn.Module:
    """``model`` moved to the CPU with the checkpoint's fp32 weights loaded (``strict=False``), as DeepSpeed's."""
    logger.info("Extracting fp32 weights")
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    logger.info("Overwriting model with fp32 weights")
    model = model.cpu()
    model.load_state_dict(sd, strict=False)
    return model


def main(argv=None, dtype_flag: bool = False) -> int:
    """``zero_to_fp32.py``'s command line; with ``dtype_flag``, ``zero_to_torch.py``'s (``--dtype`` required)."""
    parser = argparse.ArgumentParser(
        prog="ds-zero-to-fp32", description="Consolidate a ds_zero ZeRO checkpoint (stage 0-3) into one state dict.")
    parser.add_argument("checkpoint_dir", help="path to the desired checkpoint folder, e.g., path/checkpoint-12")
    parser.add_argument("output_dir", help="directory to the pytorch state_dict output files")
    if dtype_flag:
        parser.add_argument("--dtype", choices=sorted(OUTPUT_DTYPE_NAMES), required=True, help="output tensor dtype")
    parser.add_argument("--max_shard_size", default="5GB", help="largest shard before the weights are split")
    parser.add_argument("--safe_serialization", action="store_true", help="write safetensors, not torch.save")
    parser.add_argument("-t", "--tag", default=None, help="checkpoint tag (default: the one in 'latest')")
    parser.add_argument("--exclude_frozen_parameters", action="store_true", help="exclude frozen parameters")
    parser.add_argument("-d", "--debug", action="store_true", help="enable debug")
    args = parser.parse_args(argv)
    sd = convert_zero_checkpoint_to_state_dict(args.checkpoint_dir, args.output_dir, getattr(args, "dtype", "fp32"),
                                               args.max_shard_size, args.safe_serialization, args.tag,
                                               args.exclude_frozen_parameters)
    n = sum(t.numel() for t in sd.values())
    print(f"wrote {len(sd)} tensors ({n} elements) to {args.output_dir}")
    return 0


def torch_main(argv=None) -> int:
    return main(argv, dtype_flag=True)


if __name__ == "__main__":
    raise SystemExit(main())
