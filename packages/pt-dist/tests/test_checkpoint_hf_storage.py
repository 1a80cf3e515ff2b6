"""``checkpoint.HuggingFaceStorageReader`` beside torch's in the same 2 ranks: a Hugging Face model directory
(two ``.safetensors`` files, as ``save_pretrained`` shards them; fp32 and bf16) loaded by ``checkpoint.load``
into DTensors sharded by rows and by columns and into a plain tensor, each rank reading only its shard; the values
equal the files' and torch's reader's (torch's test/distributed/checkpoint/test_hf_storage.py, read side)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as tdcp
import torch.distributed.tensor as tt
from safetensors.torch import save_file

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from test_device_mesh import _both_worlds  # noqa: E402
from test_dtensor import _close_up, _meshes  # noqa: E402


def _files():
    g = torch.Generator().manual_seed(4)
    return ({"embed.weight": torch.randn(6, 4, generator=g), "norm.weight": torch.randn(4, generator=g)},
            {"head.weight": torch.randn(5, 4, generator=g).to(torch.bfloat16)})


def _load(rank, world, root):
    import pt_dist.checkpoint as dcp
    import pt_dist.tensor as pt

    _both_worlds(rank, world, "tcp")
    try:
        mesh, tmesh = _meshes((world,))
        out = []
        for lib, m, load, reader in ((pt, mesh, dcp.load, dcp.HuggingFaceStorageReader),
                                     (tt, tmesh, tdcp.load, tdcp.HuggingFaceStorageReader)):
            sd = {"embed.weight": lib.distribute_tensor(torch.zeros(6, 4), m, [lib.Shard(0)]),
                  "head.weight": lib.distribute_tensor(torch.zeros(5, 4, dtype=torch.bfloat16), m, [lib.Shard(1)]),
                  "norm.weight": torch.zeros(4)}
            load(sd, storage_reader=reader(root))
            out.append({k: (v.to_local().clone(), v.full_tensor()) if isinstance(v, lib.DTensor) else (v, v)
                        for k, v in sd.items()})
        return out
    finally:
        _close_up()


def test_huggingface_storage_reader_loads_safetensors_shards_as_torchs(tmp_path):
    first, second = _files()
    save_file(first, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(second, str(tmp_path / "model-00002-of-00002.safetensors"))
    whole = {**first, **second}
    for rank, (ours, theirs) in enumerate(run_ranks(_load, 2, str(tmp_path), backend=None, timeout=120)):
        assert set(ours) == set(theirs) == set(whole)
        for key, (local, full) in ours.items():
            t_local, t_full = theirs[key]
            assert local.dtype == whole[key].dtype and torch.equal(full, whole[key]), (rank, key)
            assert torch.equal(local, t_local) and torch.equal(full, t_full), (rank, key)
        assert ours["embed.weight"][0].shape == (3, 4) and ours["head.weight"][0].shape == (5, 2)
