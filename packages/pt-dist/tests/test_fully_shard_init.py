"""FSDP2 construction (issue 33), after torch's test/distributed/_composable/fsdp/test_fully_shard_init.py:
``TestFullyShardShardedParameterTensor`` (the local shards of uneven dim 0s, an empty one included, and their
placements, equal torch's), ``TestFullyShardMeshArg`` (3-D mesh, 2-D mesh without names),
``TestFullyShardManagedModulesAndStates`` / ``TestFullyShardParamModuleInfos`` (which modules, parameters and
tied-parameter registrations a call manages, equal torch's helpers' answers), the ``FSDP<Class>`` class swap
(names, MRO, ``__new__`` for container slicing, deepcopy refused), ``unshard`` / ``reshard`` registration, and
``TestFullyShardMetaDeviceInit`` with test_fully_shard_clip_grad_norm_.py (meta init, ``to_empty``,
``reset_parameters``, the default mesh, ``clip_grad_norm_``: two steps bit-identical, the state dicts alike),
side by side with torch's ``fully_shard`` on gloo in the same ranks. Bad input raises naming the value, with the
exception type torch raises where torch raises at all."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from test_fully_shard_common import Compare, meshes, two_worlds  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 7)  # 7 rows: 4 / 3
        self.scale = nn.Parameter(torch.full((1,), 2.0))  # 1 / 0
        self.table = nn.Parameter(torch.arange(12.0).view(3, 2, 2))  # 2 / 1
        self.register_buffer("buf", torch.ones(2))

    def forward(self, x):
        return self.lin(x).sum(-1, keepdim=True) * self.scale + self.table.sum()


def _shards(rank, torch_mesh, our_mesh):
    from pt_dist.fsdp import FSDPModule, fully_shard
    from torch.distributed.fsdp import fully_shard as torch_fs

    out = []
    for fs, mesh in ((torch_fs, torch_mesh), (fully_shard, our_mesh)):
        torch.manual_seed(0)
        model = Net()
        full = {n: p.detach().clone() for n, p in model.named_parameters()}
        fs(model.lin, mesh=mesh)
        fs(model, mesh=mesh)
        info = {n: (type(p).__name__, str(p.placements), tuple(p.shape), p.to_local().tolist(),
                    torch.equal(p.full_tensor(), full[n])) for n, p in model.named_parameters()}
        lib_module = FSDPModule if fs is fully_shard else torch.distributed.fsdp.FSDPModule
        info["classes"] = ([c.__name__ for c in type(model).__mro__], [c.__name__ for c in type(model.lin).__mro__],
                           isinstance(model, lib_module), type(nn.Sequential(model.lin)[0:1]).__name__)
        try:
            copy.deepcopy(model)
            info["deepcopy"] = None
        except AssertionError as e:
            info["deepcopy"] = str(e)
        model.unshard()
        info["unsharded"] = [type(p).__name__ for p in model.parameters()]
        model.reshard()
        info["resharded"] = [type(p).__name__ for p in model.parameters()]
        out.append(info)
    return out


def _bad_inputs(torch_mesh, our_mesh):
    import pt_dist
    import pt_dist.fsdp as of
    import torch.distributed.fsdp as tf
    from pt_dist.fsdp import CPUOffload

    t3, o3 = meshes((2, 1, 1))
    t2, o2 = meshes((2, 1))

    from pt_dist.device_mesh import DeviceMesh as OurMesh
    from torch.distributed.device_mesh import DeviceMesh as TorchMesh

    t_rank0, o_rank0 = TorchMesh("cpu", [0]), OurMesh("cpu", [0])  # every rank builds it; rank 1 is not in it

    def twice(lib, mesh):
        m = nn.Linear(2, 2)
        lib.fully_shard(m, mesh=mesh)
        lib.fully_shard(m, mesh=mesh)

    def scalar(lib, mesh):
        m = nn.Linear(2, 2)
        m.s = nn.Parameter(torch.tensor(1.0))
        lib.fully_shard(m, mesh=mesh)

    def set_raf(lib, mesh):
        lib.fully_shard(nn.Linear(2, 2), mesh=mesh).set_reshard_after_forward(1)

    def prefetch(lib, mesh):
        lib.fully_shard(nn.Linear(2, 2), mesh=mesh).set_modules_to_forward_prefetch([nn.Linear(2, 2)])

    cases = {  # name: (call(lib, mesh), torch's mesh, ours)
        "mesh_is_a_process_group": (lambda lib, mesh: lib.fully_shard(nn.Linear(2, 2), mesh=mesh), dist.group.WORLD,
                                    pt_dist.group.WORLD),
        "mesh_3d": (lambda lib, mesh: lib.fully_shard(nn.Linear(2, 2), mesh=mesh), t3, o3),
        "mesh_2d_without_names": (lambda lib, mesh: lib.fully_shard(nn.Linear(2, 2), mesh=mesh), t2, o2),
        "fully_shard_twice": (twice, torch_mesh, our_mesh),
        "mesh_without_this_rank": (lambda lib, mesh: lib.fully_shard(nn.Linear(2, 2), mesh=mesh)
                                   if dist.get_rank() == 1 else None, t_rank0, o_rank0),
        "mp_policy_not_a_policy": (lambda lib, mesh: lib.fully_shard(nn.Linear(2, 2), mesh=mesh, mp_policy="bf16"),
                                   torch_mesh, our_mesh),
        "param_dtype_not_a_dtype": (lambda lib, mesh: lib.fully_shard(
            nn.Linear(2, 2), mesh=mesh, mp_policy=lib.MixedPrecisionPolicy(param_dtype="bf16")), torch_mesh, our_mesh),
        "offload_policy_fsdp1_cpuoffload": (lambda lib, mesh: lib.fully_shard(
            nn.Linear(2, 2), mesh=mesh, offload_policy=CPUOffload()), torch_mesh, our_mesh),
        "reshard_after_forward_str": (lambda lib, mesh: lib.fully_shard(
            nn.Linear(2, 2), mesh=mesh, reshard_after_forward="yes"), torch_mesh, our_mesh),
        "reshard_after_forward_not_a_factor": (lambda lib, mesh: lib.fully_shard(
            nn.Linear(2, 2), mesh=mesh, reshard_after_forward=3), torch_mesh, our_mesh),
        "module_list_without_forward": (lambda lib, mesh: lib.fully_shard(nn.ModuleList([nn.Linear(2, 2)]),
                                                                          mesh=mesh), torch_mesh, our_mesh),
        "scalar_parameter": (scalar, torch_mesh, our_mesh),
        "set_reshard_after_forward_int": (set_raf, torch_mesh, our_mesh),
        "prefetch_a_plain_module": (prefetch, torch_mesh, our_mesh),
    }
    out = {}
    for name, (call, tmesh, omesh) in cases.items():
        got = []
        for lib, mesh in ((tf, tmesh), (of, omesh)):
            try:
                call(lib, mesh)
                got.append((None, ""))
            except Exception as e:  # noqa: BLE001 - recording what each raises
                got.append((type(e).__name__, str(e)))
        out[name] = got
    return out


class Layers(nn.Module):
    """pytorch/examples' FSDP2 flow in small: built on meta, layers in a ModuleList, ``reset_parameters``."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(6, 6) for _ in range(3)])
        self.out = nn.Linear(6, 3)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.out(x)

    def reset_parameters(self):
        for m in (*self.layers, self.out):
            m.reset_parameters()


def _meta_init_train(rank):
    """Meta-device init, ``fully_shard`` on the default mesh, ``to_empty`` + ``reset_parameters`` (on the DTensor
    shards), ``unshard()`` before forward, ``clip_grad_norm_`` over the DTensor gradients, default Adam; then the
    sharded state dict's keys, types and shapes."""
    import pt_dist.fsdp as of
    import torch.distributed.fsdp as tf

    models = []
    for lib in (tf, of):
        with torch.device("meta"):
            model = Layers()
        for layer in model.layers:
            lib.fully_shard(layer)
        lib.fully_shard(model)
        model.to_empty(device="cpu")
        torch.manual_seed(0)
        model.reset_parameters()
        models.append(model)
    cmp = Compare(f"meta init rank {rank}")
    opts = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in models]
    for step in range(2):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank * 10 + step))
        got = []
        for model in models:
            model.unshard()
            loss = model(x).sum()
            loss.backward()
            got.append((loss, torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0).full_tensor()))
        cmp.eq(f"step {step} loss", got[0][0], got[1][0])
        cmp.eq(f"step {step} total grad norm", got[0][1], got[1][1])
        cmp.grads(step, *models)
        for opt in opts:
            opt.step()
            opt.zero_grad()
        cmp.params(step, *models)
    state_dicts = [{k: (type(v).__name__, tuple(v.shape), str(v.placements)) for k, v in m.state_dict().items()}
                   for m in models]
    cmp.eq("state_dict", *state_dicts)
    return cmp.result()


def _init(rank, world):
    with two_worlds(rank, world, "fs_init"):
        torch_mesh, our_mesh = meshes((world,))
        return _shards(rank, torch_mesh, our_mesh), _bad_inputs(torch_mesh, our_mesh), _meta_init_train(rank)


@pytest.fixture(scope="module")
def init():
    return run_ranks(_init, 2, backend=None, timeout=180)


def test_sharded_parameters_equal_torchs(init):
    for rank, ((theirs, ours), _, _) in enumerate(init):
        for name in ("lin.weight", "lin.bias", "scale", "table"):
            assert ours[name] == theirs[name], name
            assert ours[name][0] == "DTensor" and ours[name][4]  # full_tensor() is the original parameter
        assert ours["scale"][3] == ([2.0] if rank == 0 else [])  # torch.chunk: rank 1's shard is empty


def test_class_swap_and_registration_as_torch(init):
    for (theirs, ours), _, _ in init:
        assert ours["classes"] == theirs["classes"]
        assert ours["classes"][:2] == (["FSDPNet", "FSDPModule", "Net", "Module", "object"],
                                       ["FSDPLinear", "FSDPModule", "Linear", "Module", "object"])
        assert ours["deepcopy"] == theirs["deepcopy"] is not None
        # unshard is not recursive: the root's own scale and table are gathered, lin's stay sharded
        assert ours["unsharded"] == theirs["unsharded"] == ["Parameter", "Parameter", "DTensor", "DTensor"]
        assert ours["resharded"] == theirs["resharded"] == ["DTensor"] * 4


# ours raises where torch fails later or not at all (torch: AttributeError, None, None, IndexError)
OURS_STRICTER = {"mesh_is_a_process_group": "TypeError", "param_dtype_not_a_dtype": "TypeError",
                 "offload_policy_fsdp1_cpuoffload": "TypeError", "mesh_without_this_rank": "ValueError"}
NAMED = {"mesh_is_a_process_group": "ProcessGroup", "mesh_3d": "1D or 2D", "mesh_2d_without_names": "mesh_dim_names",
         "fully_shard_twice": "already been applied", "mesh_without_this_rank": "is not in the mesh",
         "mp_policy_not_a_policy": "'bf16'",
         "param_dtype_not_a_dtype": "'bf16'", "offload_policy_fsdp1_cpuoffload": "CPUOffload(",
         "reshard_after_forward_str": "yes", "reshard_after_forward_not_a_factor": "not 3",
         "module_list_without_forward": "ModuleList", "scalar_parameter": "scalar parameters",
         "set_reshard_after_forward_int": "int", "prefetch_a_plain_module": "Linear"}


@pytest.mark.parametrize("case", list(NAMED))
def test_bad_input_raises_naming_the_value(init, case):
    for rank, (_, bad, _) in enumerate(init):
        if case == "mesh_without_this_rank" and rank == 0:
            continue  # only rank 1 is outside the mesh
        (torch_type, _), (our_type, our_msg) = bad[case]
        assert our_type == OURS_STRICTER.get(case, torch_type) and our_type is not None, (case, bad[case])
        assert NAMED[case] in our_msg, (case, our_msg)


def test_meta_device_init_to_empty_and_clip_grad_norm_match_torch(init):
    for _, _, (fails, count) in init:
        assert count > 50 and not fails, fails[:5]


def test_managed_modules_states_and_param_infos_equal_torchs():
    from pt_dist.fsdp._fully_shard._fsdp_init import _get_managed_modules, _get_managed_states
    from pt_dist.fsdp._fully_shard._fsdp_param_group import _get_param_module_infos
    from torch.distributed.fsdp._fully_shard._fsdp_init import _get_managed_modules as t_modules
    from torch.distributed.fsdp._fully_shard._fsdp_init import _get_managed_states as t_states
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import _get_param_module_infos as t_infos

    mlp = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    tied = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    tied[0].weight = tied[1].weight
    tied[2].weight = tied[1].weight
    tied[1].register_buffer("b", torch.ones(1))
    tied[2].b = tied[1].b
    for model in (mlp, nn.Sequential(mlp, mlp), tied):
        mods, tmods = _get_managed_modules((model,)), t_modules((model,))
        assert mods == tmods
        (params, bufs), (tparams, tbufs) = _get_managed_states(mods), t_states(tmods)
        assert params == tparams and [id(b) for b in bufs] == [id(b) for b in tbufs]
        infos, tinfos = _get_param_module_infos(params, (model,)), t_infos(tparams, (model,))
        assert [(i.module, i.param_name, i.shared_modules, i.shared_param_names) for i in infos] == \
            [(i.module, i.param_name, i.shared_modules, i.shared_param_names) for i in tinfos]
    assert len(_get_param_module_infos(params, (tied,))[0].shared_modules) == 2  # the check itself can fail
