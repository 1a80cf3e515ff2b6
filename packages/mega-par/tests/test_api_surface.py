"""The names users of Megatron-core reach for around mega_par's modules (found by ``shared/tools/api_gap.py``), on 2
gloo ranks: ``megatron.core``'s top-level exports; ``parallel_state.is_initialized``, ``check_initialized=False``,
``vp_stage`` on the stage predicates, the expert-parallel size (1: no expert parallelism); the optimizers'
``param_groups``, ``get_parameters``, ``get_loss_scale`` / ``scale_loss``, ``clip_grad_norm``, ``count_zeros``,
``reload_model_params`` (plain and distributed, each checked against a direct computation);
``TransformerBlock.has_final_layernorm_in_this_stage``, ``LanguageModelEmbedding.zero_parameters``;
``ProcessGroupCollection`` (``process_groups_config.py``) and ``GPTModel(pg_collection=)``; Megatron's parameter
names and defaults where mega_par's differed (``RotaryEmbedding`` at Megatron's path and in its argument order);
``utils.py``'s helpers."""

import importlib.util
import pathlib

import pytest
import torch

import harness

_spec = importlib.util.spec_from_file_location("mega_par_test_helpers", pathlib.Path(__file__).with_name("_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)


def _exports(rank, world):
    import mega_par
    from mega_par import DistributedDataParallel, ModelParallelConfig, parallel_state, tensor_parallel
    from mega_par.distributed import DistributedDataParallel as DDP
    from mega_par.transformer import MegatronModule, ModuleSpec, TransformerLayerSubmodules, build_module

    assert DistributedDataParallel is DDP and ModelParallelConfig.__name__ == "ModelParallelConfig"
    assert parallel_state is mega_par.parallel_state and tensor_parallel.broadcast_data
    assert MegatronModule and ModuleSpec and TransformerLayerSubmodules and build_module


def _parallel_state(rank, world):
    from mega_par import parallel_state as ps

    assert not ps.is_initialized()
    assert ps.get_tensor_model_parallel_group(check_initialized=False) is None
    assert ps.get_embedding_group(check_initialized=False) is None
    with pytest.raises(RuntimeError, match="not initialised"):
        ps.get_tensor_model_parallel_group()
    ps.initialize_model_parallel(1, 2, virtual_pipeline_model_parallel_size=2)
    try:
        assert ps.is_initialized() and ps.get_expert_model_parallel_world_size() == 1
        assert ps.get_expert_model_parallel_rank() == 0
        first, last = rank == 0, rank == 1
        assert [ps.is_pipeline_first_stage(vp_stage=v) for v in (0, 1)] == [first, False]
        assert [ps.is_pipeline_last_stage(vp_stage=v) for v in (0, 1)] == [False, last]
        assert ps.is_pipeline_first_stage(ignore_virtual=True, vp_stage=1) == first
        assert [ps.is_rank_in_embedding_group(vp_stage=v) for v in (0, 1)] == [first, last]
    finally:
        ps.destroy_model_parallel()


def _model_and_optimizer(distributed: bool):
    from mega_par.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from mega_par.models.gpt import GPTModel, get_gpt_layer_local_spec
    from mega_par.optimizer import OptimizerConfig, get_megatron_optimizer
    from mega_par.transformer import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, hidden_dropout=0.0,
                               attention_dropout=0.0)
    model = GPTModel(config, get_gpt_layer_local_spec(), 32, 8, seed=0)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=distributed,
                                                                        bucket_size=300), model)
    opt = get_megatron_optimizer(OptimizerConfig(lr=0.1, use_distributed_optimizer=distributed), [ddp])
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    ddp(ids, None, None, labels=ids).mean().backward()
    ddp.finish_grad_sync()
    return model, opt


def _optimizer(rank, world):
    from mega_par import parallel_state as ps

    ps.initialize_model_parallel(1, 1)
    try:
        for distributed in (False, True):
            model, opt = _model_and_optimizer(distributed)
            assert torch.equal(opt.get_loss_scale(), torch.ones(1))
            assert opt.scale_loss(torch.tensor(3.0)).item() == 3.0
            opt.param_groups[0]["lr"] = 0.05
            assert opt.optimizer.param_groups[0]["lr"] == 0.05
            grads = [p.main_grad for p in model.parameters()]
            zeros = sum(g.numel() - torch.count_nonzero(g).item() for g in grads)
            if not distributed:
                assert set(map(id, opt.get_parameters())) == set(map(id, model.parameters()))
            # the ranks ran the same batch, so the reduced gradients have the local ones' zeros; the distributed
            # optimizer counts its shard on each DP rank and sums them
            assert zeros > 0 and opt.count_zeros() == zeros
            if not distributed:  # DistributedDataParallel.scale_gradients: every buffered gradient times the factor
                before = [g.clone() for g in grads]
                opt.model_chunks[0].scale_gradients(0.5)
                assert all(torch.equal(g, b * 0.5) for g, b in zip(grads, before))
                opt.model_chunks[0].scale_gradients(2.0)
            norm = opt.get_grad_norm()
            assert norm > 0
            assert opt.clip_grad_norm(norm / 2) == pytest.approx(norm)
            assert opt.get_grad_norm() == pytest.approx(norm / 2, rel=1e-5)
            if distributed:
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(0.25)
                opt.reload_model_params()
                assert all(torch.equal(x.main, torch.full_like(x.main, 0.25)) for x in opt.pieces)
    finally:
        ps.destroy_model_parallel()


def _block_and_embedding(rank, world):
    from mega_par import parallel_state as ps
    from mega_par.models.gpt import GPTModel, get_gpt_layer_local_spec
    from mega_par.transformer import TransformerConfig

    ps.initialize_model_parallel(1, 2)
    try:
        config = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2,
                                   pipeline_model_parallel_size=2, pipeline_dtype=torch.float32)
        model = GPTModel(config, get_gpt_layer_local_spec(), 32, 8, pre_process=rank == 0, post_process=rank == 1,
                         seed=0)
        assert model.decoder.has_final_layernorm_in_this_stage() == (rank == 1)
        if rank == 0:
            model.embedding.zero_parameters()
            assert all(not p.any() and p.shared for p in model.embedding.parameters())
    finally:
        ps.destroy_model_parallel()


def _pg_collection(rank, world):
    """``ProcessGroupCollection.use_mpu_process_groups()`` holds parallel_state's groups; GPTModel takes it, and
    refuses one whose groups are not parallel_state's (its layers use those)."""
    import torch.distributed as dist
    from mega_par import parallel_state as ps
    from mega_par.models.gpt import GPTModel, get_gpt_layer_local_spec
    from mega_par.process_groups_config import ProcessGroupCollection
    from mega_par.transformer import TransformerConfig

    assert ProcessGroupCollection.use_mpu_process_groups().tp is None  # before the grid: None, as Megatron's
    other = dist.new_group([0, 1])
    ps.initialize_model_parallel(1, 1)
    try:
        pgc = ProcessGroupCollection.use_mpu_process_groups()
        assert pgc.tp is ps.get_tensor_model_parallel_group() and pgc.dp is ps.get_data_parallel_group()
        assert ProcessGroupCollection.use_mpu_process_groups(["tp"]).pp is None
        config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2)
        model = GPTModel(config, get_gpt_layer_local_spec(), 32, 8, seed=0, pg_collection=pgc)
        assert model.pg_collection is pgc and model.tp_group is pgc.tp
        with pytest.raises(ValueError, match="pg_collection.tp is not parallel_state's tp group"):
            GPTModel(config, get_gpt_layer_local_spec(), 32, 8, seed=0,
                     pg_collection=ProcessGroupCollection(tp=other, pp=pgc.pp, cp=pgc.cp))
        from mega_par.distributed.finalize_model_grads import finalize_model_grads

        finalize_model_grads(model=[model], pg_collection=pgc)  # Megatron's keywords; parallel_state's groups
        with pytest.raises(ValueError, match="force_all_reduce=True is not supported"):
            finalize_model_grads([model], force_all_reduce=True)
        with pytest.raises(ValueError, match="pg_collection.tp is not parallel_state's"):
            finalize_model_grads([model], pg_collection=ProcessGroupCollection(tp=other))
        with pytest.raises(ValueError, match="Unknown attribute: ep"):
            ProcessGroupCollection(ep=other)
        with pytest.raises(ValueError, match=r"Invalid process groups requested: \['hcp'\]"):
            ProcessGroupCollection.use_mpu_process_groups(["tp", "hcp"])
    finally:
        ps.destroy_model_parallel()


def _signatures(rank, world):
    """Megatron's parameters: ``scaled_init_method_normal(multiplier=)``, ``get_transformer_layer_offset`` and
    ``get_num_layers_to_build`` for another stage (``pp_rank=``), ``TransformerBlock(post_layer_norm=False)``, the
    mappings' ``input_``."""
    from mega_par import parallel_state as ps
    from mega_par.models.gpt import get_gpt_layer_local_spec
    from mega_par.tensor_parallel import copy_to_tensor_model_parallel_region, scaled_init_method_normal
    from mega_par.transformer import TransformerBlock, TransformerConfig
    from mega_par.transformer.transformer_block import get_num_layers_to_build, get_transformer_layer_offset

    for multiplier, std in ((2.0, 0.02 / 8 ** 0.5), (1.0, 0.01)):
        w = torch.empty(400, 400)
        torch.manual_seed(0)
        scaled_init_method_normal(0.02, 4, multiplier=multiplier)(w)
        assert abs(w.std().item() - std) < 0.02 * std, (multiplier, w.std().item())
    ps.initialize_model_parallel(1, 2)
    try:
        config = TransformerConfig(num_layers=4, hidden_size=16, num_attention_heads=2,
                                   pipeline_model_parallel_size=2, pipeline_dtype=torch.float32)
        assert [get_transformer_layer_offset(config, pp_rank=r) for r in (0, 1)] == [0, 2]
        assert get_transformer_layer_offset(config) == 2 * rank and get_num_layers_to_build(config, pp_rank=0) == 2
        block = TransformerBlock(config, get_gpt_layer_local_spec(), post_layer_norm=False, post_process=True)
        assert block.final_layernorm is None and not block.has_final_layernorm_in_this_stage()
        x = torch.ones(2, requires_grad=True)
        copy_to_tensor_model_parallel_region(input_=x).sum().backward()
        assert torch.equal(x.grad, torch.ones(2))
    finally:
        ps.destroy_model_parallel()


def _utils(rank, world):
    """``megatron.core.utils``: ``divide``, ``get_attr_wrapped_model`` / ``get_model_config`` through the DDP and
    Float16Module wrappers, ``is_torch_min_version``."""
    from mega_par import parallel_state as ps
    from mega_par.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from mega_par.models.gpt import GPTModel, get_gpt_layer_local_spec
    from mega_par.transformer import TransformerConfig
    from mega_par.transformer.module import Float16Module
    from mega_par.utils import divide, get_attr_wrapped_model, get_model_config, is_torch_min_version

    assert divide(12, 4) == 3
    with pytest.raises(ValueError, match="12 is not divisible by 5"):
        divide(12, 5)
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert is_torch_min_version(f"{major}.{minor}") and not is_torch_min_version(f"{major}.{minor}", False)
    assert not is_torch_min_version(f"{major + 1}.0")
    ps.initialize_model_parallel(1, 1)
    try:
        config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, bf16=True)
        model = GPTModel(config, get_gpt_layer_local_spec(), 32, 8, seed=0)
        wrapped = DistributedDataParallel(config, DistributedDataParallelConfig(), Float16Module(config, model))
        assert get_model_config(wrapped) is config
        assert get_attr_wrapped_model(wrapped, "decoder") is model.decoder
        assert get_attr_wrapped_model(wrapped, "decoder", return_model_obj=True) is model
        with pytest.raises(RuntimeError, match="couldn't find attribute no_such"):
            get_attr_wrapped_model(wrapped, "no_such")
        with pytest.raises(RuntimeError, match="given a list of models"):
            get_model_config([wrapped])
    finally:
        ps.destroy_model_parallel()


def _rotary(rank, world):
    """``RotaryEmbedding`` with Megatron's signature at Megatron's path: ``rotary_percent`` second (``(64, 1.0)``
    means what it means there; the partial, interleaved, interpolated and scaled variants refused by name), the angles
    as ``[s, 1, 1, d]`` from ``offset``; ``apply_rotary_pos_emb`` takes them in that shape or as ``[s, d]``."""
    from mega_par.models.common.embeddings import RotaryEmbedding as Exported
    from mega_par.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding, apply_rotary_pos_emb

    assert Exported is RotaryEmbedding
    rope = RotaryEmbedding(8, 1.0)
    assert torch.equal(rope.inv_freq, RotaryEmbedding(8, rotary_base=10000).inv_freq)
    assert not torch.equal(rope.inv_freq, RotaryEmbedding(8, rotary_base=500000).inv_freq)
    emb = rope(5)
    assert emb.shape == (5, 1, 1, 8) and torch.equal(rope(3, offset=2), emb[2:])
    assert torch.equal(emb[:, 0, 0, :4], torch.outer(torch.arange(5.0), rope.inv_freq))
    t = torch.randn(5, 2, 3, 8)
    assert torch.equal(apply_rotary_pos_emb(t, emb), apply_rotary_pos_emb(t, emb[:, 0, 0, :]))
    assert torch.equal(apply_rotary_pos_emb(t[:1], emb[:1]), t[:1])  # position 0: no rotation
    for kw, name in ((dict(rotary_percent=0.5), "rotary_percent=0.5"), (dict(rotary_interleaved=True),
                     "rotary_interleaved=True"), (dict(rope_scaling=True), "rope_scaling=True")):
        with pytest.raises(ValueError, match=name):
            RotaryEmbedding(8, **kw)
    with pytest.raises(ValueError, match="packed_seq=True"):
        rope(5, packed_seq=True)


CASES = {"exports": _exports, "rotary": _rotary, "utils": _utils, "signatures": _signatures,
         "pg_collection": _pg_collection, "parallel_state": _parallel_state, "optimizer": _optimizer,
         "block_and_embedding": _block_and_embedding}


def _rank_main(rank, world):
    return H.run_cases({name: (lambda f=f: f(rank, world)) for name, f in CASES.items()})


@pytest.fixture(scope="module")
def results():
    return harness.run_ranks(_rank_main, 2, backend="gloo", timeout=300)


@pytest.mark.parametrize("case", list(CASES))
def test_api_surface_case(results, case):
    H.assert_case(results, case)
