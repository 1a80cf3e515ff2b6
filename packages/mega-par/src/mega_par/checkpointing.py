"""Per-rank checkpoints; merging TP/PP shards into a Hugging Face directory (``megatron/training/checkpointing``).

Layout (Megatron's)::

    <save>/latest_checkpointed_iteration.txt
    <save>/iter_0000005/mp_rank_<tp:02d>_<pp:03d>/model_optim_rng.pt      (written by DP rank 0)
    <save>/iter_0000005/mp_rank_<tp:02d>_<pp:03d>/distrib_optim_dp<dp:03d>.pt   (distributed optimizer shards)

Every file is written to a temporary name and renamed, so a crash never leaves a half-written checkpoint.
``to_hf`` merges the shards (TP by each parameter's partition dim and stride, PP by layer offset) into
``config.json`` + ``model.safetensors`` with Llama names, loadable by ``transformers.LlamaForCausalLM``.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from mega_par import parallel_state as ps
from mega_par._infra.atomic_io import atomic_write, atomic_write_text

TRACKER = "latest_checkpointed_iteration.txt"


def get_checkpoint_name(save: str, iteration: int, tp_rank: int, pp_rank: int) -> str:
    return os.path.join(save, f"iter_{iteration:07d}", f"mp_rank_{tp_rank:02d}_{pp_rank:03d}")


def _unwrap(m):
    return getattr(m, "module", m)


def _tp_meta(model) -> dict:
    """name -> (partition_dim, stride) for TP-sharded parameters, so shards can be merged without the code."""
    return {n: (p.partition_dim, p.partition_stride) for n, p in model.named_parameters()
            if getattr(p, "tensor_model_parallel", False)}


def save_checkpoint(iteration: int, model_chunks, optimizer, args) -> str:
    """Collective over all ranks: each (tp, pp) writes its shard once, DP shards of the optimizer separately."""
    dp_rank = ps.get_data_parallel_rank()
    folder = get_checkpoint_name(args.save, iteration, ps.get_tensor_model_parallel_rank(),
                                 ps.get_pipeline_model_parallel_rank())
    os.makedirs(folder, exist_ok=True)
    distributed = hasattr(optimizer, "sharded_state_dict")
    if dp_rank == 0:
        state = {"iteration": iteration, "checkpoint_version": 3.0,
                 "args": dataclasses.asdict(args) if dataclasses.is_dataclass(args) else dict(vars(args)),
                 "tp_size": ps.get_tensor_model_parallel_world_size(),
                 "pp_size": ps.get_pipeline_model_parallel_world_size(),
                 "rng_state": torch.get_rng_state()}
        for i, m in enumerate(model_chunks):
            inner = _unwrap(m)
            key = "model" if len(model_chunks) == 1 else f"model{i}"
            state[key] = {k: v.detach().clone() for k, v in inner.state_dict().items()}
            state[f"{key}_tp_meta"] = _tp_meta(inner)
            state[f"{key}_layer_numbers"] = [layer.layer_number for layer in inner.decoder.layers]
        if not distributed:
            state["optimizer"] = optimizer.state_dict()
        atomic_write(os.path.join(folder, "model_optim_rng.pt"), lambda tmp: torch.save(state, tmp))
    if distributed:
        shard = optimizer.sharded_state_dict()
        atomic_write(os.path.join(folder, f"distrib_optim_dp{dp_rank:03d}.pt"), lambda tmp: torch.save(shard, tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        atomic_write_text(os.path.join(args.save, TRACKER), str(iteration))
    dist.barrier()
    return folder


def load_checkpoint(load: str, model_chunks, optimizer=None) -> int:
    """Load this rank's shard of the latest checkpoint; returns its iteration."""
    iteration = int(open(os.path.join(load, TRACKER)).read().strip())
    folder = get_checkpoint_name(load, iteration, ps.get_tensor_model_parallel_rank(),
                                 ps.get_pipeline_model_parallel_rank())
    state = torch.load(os.path.join(folder, "model_optim_rng.pt"), weights_only=False)
    if (state["tp_size"], state["pp_size"]) != (ps.get_tensor_model_parallel_world_size(),
                                                ps.get_pipeline_model_parallel_world_size()):
        raise ValueError(f"checkpoint {load} was saved with tp={state['tp_size']}, pp={state['pp_size']}; this run has "
                         f"tp={ps.get_tensor_model_parallel_world_size()}, "
                         f"pp={ps.get_pipeline_model_parallel_world_size()} (convert with to_hf instead)")
    for i, m in enumerate(model_chunks):
        _unwrap(m).load_state_dict(state["model" if len(model_chunks) == 1 else f"model{i}"])
    if optimizer is not None:
        if hasattr(optimizer, "sharded_state_dict"):
            path = os.path.join(folder, f"distrib_optim_dp{ps.get_data_parallel_rank():03d}.pt")
            optimizer.load_state_dict(torch.load(path, weights_only=False))
        else:
            optimizer.load_state_dict(state["optimizer"])
    return iteration


def _merge_tp(shards: list, dim: int, stride: int) -> torch.Tensor:
    if stride == 1:
        return torch.cat(shards, dim=dim)
    # each shard is [chunk_0 .. chunk_{stride-1}] of its rank; the full tensor is chunk-major over ranks
    pieces = [s.chunk(stride, dim=dim) for s in shards]
    return torch.cat([pieces[r][k] for k in range(stride) for r in range(len(shards))], dim=dim)


def merge_shards(by_rank: dict) -> dict:
    """Full (unsharded) tensors with global layer indices from ``{(tp_rank, pp_rank): shard}``, where a shard
    holds ``model`` (or ``model0``, ``model1``, ... per virtual chunk), ``model_tp_meta`` and
    ``model_layer_numbers`` as ``save_checkpoint`` writes them (tests merge gradients the same way)."""
    first = by_rank[(0, 0)]
    tp, pp = first["tp_size"], first["pp_size"]
    missing = [(t, p) for t in range(tp) for p in range(pp) if (t, p) not in by_rank]
    if missing:
        raise FileNotFoundError(f"shards (tp_rank, pp_rank) {missing} are missing")
    merged = {}
    for p in range(pp):
        keys = sorted(k for k in by_rank[(0, p)] if re.fullmatch(r"model\d*", k))
        for key in keys:
            meta, numbers = by_rank[(0, p)][f"{key}_tp_meta"], by_rank[(0, p)][f"{key}_layer_numbers"]
            for name, tensor in by_rank[(0, p)][key].items():
                if name in meta:
                    dim, stride = meta[name]
                    tensor = _merge_tp([by_rank[(t, p)][key][name] for t in range(tp)], dim, stride)
                m = re.match(r"decoder\.layers\.(\d+)\.(.*)", name)
                if m:  # local layer index -> global (0-based) layer index
                    name = f"decoder.layers.{numbers[int(m.group(1))] - 1}.{m.group(2)}"
                merged[name] = tensor
    return merged


def load_merged_state_dict(checkpoint_dir: str, iteration: int | None = None) -> tuple[dict, dict]:
    """Full (unsharded) state dict with global layer indices, and the training args."""
    if iteration is None:
        iteration = int(open(os.path.join(checkpoint_dir, TRACKER)).read().strip())
    folders = sorted(glob.glob(os.path.join(checkpoint_dir, f"iter_{iteration:07d}", "mp_rank_*")))
    if not folders:
        raise FileNotFoundError(f"no mp_rank_* shards for iteration {iteration} in {checkpoint_dir}")
    by_rank = {}
    for f in folders:
        tp_rank, pp_rank = map(int, re.search(r"mp_rank_(\d+)_(\d+)$", f).groups())
        by_rank[(tp_rank, pp_rank)] = torch.load(os.path.join(f, "model_optim_rng.pt"), weights_only=False)
    try:
        merged = merge_shards(by_rank)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"checkpoint {checkpoint_dir}: {e}") from None
    return merged, by_rank[(0, 0)]["args"]


def llama_state_dict(sd: dict, args: dict) -> dict:
    """Unsharded mega_par GPT state dict -> Hugging Face Llama tensor names (QKV groups de-interleaved)."""
    heads, hidden = args["num_attention_heads"], args["hidden_size"]
    groups = args["num_query_groups"] or heads
    hd = hidden // heads
    out = {"model.embed_tokens.weight": sd["embedding.word_embeddings.weight"],
           "model.norm.weight": sd["decoder.final_layernorm.weight"]}
    if "output_layer.weight" in sd:
        out["lm_head.weight"] = sd["output_layer.weight"]
    for i in range(args["num_layers"]):
        pre, hf = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = sd[pre + "self_attention.linear_qkv.weight"].view(groups, heads // groups + 2, hd, hidden)
        out[hf + "self_attn.q_proj.weight"] = qkv[:, :-2].reshape(heads * hd, hidden)
        out[hf + "self_attn.k_proj.weight"] = qkv[:, -2].reshape(groups * hd, hidden)
        out[hf + "self_attn.v_proj.weight"] = qkv[:, -1].reshape(groups * hd, hidden)
        out[hf + "self_attn.o_proj.weight"] = sd[pre + "self_attention.linear_proj.weight"]
        gate, up = sd[pre + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out[hf + "mlp.gate_proj.weight"], out[hf + "mlp.up_proj.weight"] = gate, up
        out[hf + "mlp.down_proj.weight"] = sd[pre + "mlp.linear_fc2.weight"]
        out[hf + "input_layernorm.weight"] = sd[pre + "input_layernorm.weight"]
        out[hf + "post_attention_layernorm.weight"] = sd[pre + "pre_mlp_layernorm.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def to_hf(checkpoint_dir: str, out_dir: str, iteration: int | None = None) -> str:
    """Merge TP/PP shards into a Llama-style Hugging Face directory (config.json + model.safetensors)."""
    sd, args = load_merged_state_dict(checkpoint_dir, iteration)
    needs = {"normalization": "RMSNorm", "position_embedding_type": "rope", "swiglu": True, "add_bias_linear": False}
    wrong = {k: args.get(k) for k, v in needs.items() if args.get(k) != v}
    if wrong:
        raise ValueError(f"to_hf writes Llama-style checkpoints, which need {needs}; this checkpoint has {wrong}")
    heads, hidden = args["num_attention_heads"], args["hidden_size"]
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": args["vocab_size"],
        "hidden_size": hidden, "intermediate_size": args["ffn_hidden_size"] or 4 * hidden,
        "num_hidden_layers": args["num_layers"], "num_attention_heads": heads,
        "num_key_value_heads": args["num_query_groups"] or heads, "head_dim": hidden // heads,
        "max_position_embeddings": args["seq_length"], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": not args["untie_embeddings_and_output_weights"], "torch_dtype": "float32",
        "initializer_range": 0.02, "bos_token_id": None, "eos_token_id": None,
    }
    tensors = llama_state_dict(sd, args)
    if config["tie_word_embeddings"]:
        tensors.pop("lm_head.weight", None)
    os.makedirs(out_dir, exist_ok=True)
    atomic_write(os.path.join(out_dir, "model.safetensors"),
                 lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    atomic_write_text(os.path.join(out_dir, "config.json"), json.dumps(config, indent=2))
    return out_dir
