"""Implementation complexity as lines of code: the files each package's README names for a strategy, counted
without blank lines, comments and docstrings (``tokenize``), so prose does not count as complexity."""

from __future__ import annotations

import importlib.util
import io
import tokenize
from pathlib import Path

# strategy -> (package, files under its import root); the package READMEs' concept tables name these files
FILES = {
    "pt-dist-ddp": ("pt_dist", ["nn/parallel/distributed.py", "nn/parallel/reducer.py", "nn/parallel/bucketing.py"]),
    "pt-dist-fsdp": ("pt_dist", ["fsdp/fully_sharded_data_parallel.py", "fsdp/flat_param.py", "fsdp/wrap.py",
                                 "fsdp/api.py", "fsdp/state_dict.py"]),
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


def code_lines(source: str) -> int:
    lines, previous = set(), tokenize.NEWLINE
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in skip:
            if tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                previous = tok.type
            continue
        starts_statement = previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        previous = tok.type
        if tok.type == tokenize.STRING and starts_statement:  # a docstring (or a bare string statement)
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines)


def package_root(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(package)
    return Path(list(spec.submodule_search_locations)[0])


def strategy_loc(name: str) -> dict:
    """``{"files": [...], "lines": n}`` for a strategy of this repository; peers are not counted."""
    package, files = FILES[name]
    root = package_root(package)
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{package}: {missing} (the strategy's files moved: update compare/loc.py)")
    per_file = {f"{package}/{f}": code_lines((root / f).read_text()) for f in files}
    return {"files": per_file, "lines": sum(per_file.values())}
