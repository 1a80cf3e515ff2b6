"""Implementation complexity as lines of code: the core files each package's README names for a strategy, counted
as ``miniframes-lines`` counts (without blank lines, comments and docstrings), so prose does not count."""

from __future__ import annotations

from harness.layers import code_lines, import_root

# strategy -> (package, files under its import root); the package READMEs' concept tables name these files
FILES = {
    "pt-dist-ddp": ("pt_dist", ["nn/parallel/distributed.py", "nn/parallel/reducer.py", "nn/parallel/bucketing.py"]),
    "pt-dist-fsdp": ("pt_dist", ["fsdp/_runtime_utils.py", "fsdp/flat_param.py", "fsdp/wrap.py",
                                 "fsdp/_common_utils.py", "fsdp/state_dict.py"]),
    "zero-1": ("ds_zero", ["runtime/zero/stage_1_and_2.py", "runtime/zero/base_optimizer.py",
                           "runtime/zero/flat_reducer.py"]),
    "zero-2": ("ds_zero", ["runtime/zero/stage_1_and_2.py", "runtime/zero/base_optimizer.py",
                           "runtime/zero/flat_reducer.py", "runtime/zero/reduce_scatter.py"]),
    "zero-3": ("ds_zero", ["runtime/zero/stage3.py", "runtime/zero/partition_parameters.py",
                           "runtime/zero/partitioned_param_coordinator.py", "runtime/zero/base_optimizer.py",
                           "runtime/zero/reduce_scatter.py"]),
    "zero-2-offload": ("ds_zero", ["runtime/zero/stage_1_and_2.py", "runtime/zero/base_optimizer.py",
                                   "runtime/zero/flat_reducer.py", "runtime/zero/reduce_scatter.py",
                                   "runtime/zero/offload.py", "ops/adam/cpu_adam.py"]),
    # TP needs the model written for it: the attention and MLP that place Column/RowParallelLinear count too
    "tp": ("mega_par", ["tensor_parallel/layers.py", "tensor_parallel/mappings.py", "tensor_parallel/cross_entropy.py",
                        "tensor_parallel/random.py", "parallel_state.py", "transformer/attention.py",
                        "transformer/mlp.py"]),
    "tp-sp": ("mega_par", ["tensor_parallel/layers.py", "tensor_parallel/mappings.py",
                           "tensor_parallel/cross_entropy.py", "tensor_parallel/random.py", "parallel_state.py",
                           "transformer/attention.py", "transformer/mlp.py"]),
    "pp": ("mega_par", ["pipeline_parallel/schedules.py", "pipeline_parallel/p2p_communication.py",
                        "parallel_state.py"]),
}


def strategy_loc(name: str) -> dict:
    """``{"files": [...], "lines": n}`` for a strategy of this repository; peers are not counted."""
    package, files = FILES[name]
    root = import_root(package)
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{package}: {missing} (the strategy's files moved: update compare/loc.py)")
    per_file = {f"{package}/{f}": code_lines((root / f).read_text()) for f in files}
    return {"files": per_file, "lines": sum(per_file.values())}
