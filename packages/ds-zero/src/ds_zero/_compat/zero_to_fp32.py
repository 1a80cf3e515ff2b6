"""Consolidate a ZeRO checkpoint (any stage, any world size) into one fp32 state dict.

DeepSpeed's ``zero_to_fp32.py``: read every rank's fp32 master partition and stitch the parameters
back together from the partition layout recorded in the checkpoint, then add the module's buffers.
CLI: ``ds-zero-to-fp32 CHECKPOINT_DIR OUTPUT [--tag TAG]`` writes safetensors.
"""

from __future__ import annotations

import argparse
import os

import torch

from ds_zero._compat.checkpoint import MODEL_FILE, optim_file, resolve_tag_dir


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None) -> dict[str, torch.Tensor]:
    path = resolve_tag_dir(checkpoint_dir, tag)
    if path is None:
        raise FileNotFoundError(f"no 'latest' file in {str(checkpoint_dir)!r}; pass tag=")
    states = torch.load(os.path.join(path, MODEL_FILE), map_location="cpu", weights_only=False)
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
    for name, t in states["module"].items():
        if name not in out:
            out[name] = t.float().clone() if t.is_floating_point() else t.clone()
    return out


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_file, tag=None) -> dict[str, torch.Tensor]:
    from safetensors.torch import save_file

    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    tmp = f"{output_file}.tmp{os.getpid()}"
    save_file({k: v.contiguous() for k, v in sd.items()}, tmp, metadata={"format": "pt"})
    os.replace(tmp, output_file)
    return sd


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="ds-zero-to-fp32",
        description="Consolidate a ds_zero ZeRO checkpoint (stage 0-3) into one fp32 safetensors file.")
    parser.add_argument("checkpoint_dir", help="the directory save_checkpoint wrote (holding 'latest')")
    parser.add_argument("output_file", help="where to write the fp32 state dict (.safetensors)")
    parser.add_argument("-t", "--tag", default=None, help="checkpoint tag (default: the one in 'latest')")
    args = parser.parse_args(argv)
    sd = convert_zero_checkpoint_to_fp32_state_dict(args.checkpoint_dir, args.output_file, args.tag)
    n = sum(t.numel() for t in sd.values())
    print(f"wrote {len(sd)} tensors ({n} elements) to {args.output_file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
