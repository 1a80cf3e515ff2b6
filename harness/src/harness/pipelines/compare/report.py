"""The report directory: ``report.md`` (the measured tables, the seed's qualitative tables next to them, cell by
cell), ``results.json`` (every number), PNG charts, and the terminal summary."""

from __future__ import annotations

import json
from pathlib import Path

from harness.pipelines.compare import formulas
from harness.pipelines.compare.measure import STRATEGIES

MB = 1e6
KINDS = ("parameters", "gradients", "optimizer_states", "activations")
SEED_TRAINING = {  # the seed chapter's table: DDP / DeepSpeed ZeRO-3 / Megatron-LM TP
    "parameter scale": ("~10B", "~1T", "~1T"),
    "communication cost": ("low", "medium", "high"),
    "memory efficiency": ("low", "high", "medium"),
    "implementation complexity": ("low", "medium", "high"),
}
NOTES = {
    "torch-ddp": "its C++ reducer is given torch's own allreduce_hook, so the all-reduce is made where the counter "
                 "sees it; waits happen in C++ (no blocked time)",
    "pt-dist-fsdp": "FULL_SHARD; the root unit (embeddings, final norm, head) stays gathered from forward to "
                    "backward, as torch's FSDP does, so the all-gathers move 2Ψ minus the root, not 2Ψ",
    "zero-1": "gradients reduce-scattered to their owners (`--zero-collectives owner`); on gloo ds-zero's default "
              "all-reduces them (3Ψ), being faster there",
    "deepspeed-zero-2": "on gloo DeepSpeed all-reduces the gradient buckets, then all-gathers: 3Ψ",
    "deepspeed-zero-3": "DeepSpeed keeps parameters gathered from forward to backward when they are reused within "
                        "stage3_max_reuse_distance (1e9 elements by default: this whole model), so it gathers once: "
                        "2Ψ, as ds-zero does given the same JSON",
    "tp": "4 all-reduces of b·s·h per layer, the embedding's forward and the output layer's backward all-reduce, "
          "the vocab-parallel cross entropy's 3 of b·s, the grad norm",
    "tp-sp": "all-gathers and reduce-scatters of b·s·h replace the all-reduces (same volume); the norm weights' "
             "gradients are all-reduced over the TP group",
    "pp": "each rank sends one activation (forward) or gradient (backward) per micro-batch (4 here)",
}
SEED_INFERENCE = {"memory efficiency": ("high (PagedAttention)", "medium", "medium"),
                  "throughput": ("high", "very high", "medium")}


def _fmt_params(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def _order_agrees(values: list[float], labels: tuple, rank_words: dict) -> bool:
    """Do the measured values order the three strategies as the seed's words do (ties in words allowed)?"""
    words = [rank_words[w.split()[0]] for w in labels]
    pairs = [(i, j) for i in range(3) for j in range(3) if words[i] < words[j]]
    return all(values[i] < values[j] for i, j in pairs)


def training_rows(results: dict) -> list[dict]:
    rows = []
    for name, r in results.items():
        m, c = r["memory"], r["comm"]
        psi = r["num_params"]
        rows.append({"name": name, "label": STRATEGIES[name][2], "psi": psi,
                     **{k: m.get(k, 0) for k in KINDS}, "offload": m.get("offload", 0),
                     "state_total": sum(m.get(k, 0) for k in KINDS[:3]),
                     "collectives": c["collectives"], "volume": c["volume_bytes"], "wire": c["wire_bytes"],
                     "volume_psi": c["volume_bytes"] / (4 * psi), "step": r["step_median"],
                     "comm_share": r["comm_seconds"] / r["step_median"] if r["comm_visible"] else None,
                     "loc": r.get("loc"), "scale": r.get("scale", {})})
    return rows


def seed_comparison(rows: dict, devices: list[int], shape: dict, world: int) -> list[tuple]:
    """(feature, seed cells, measured cells, agrees, why) for DDP / ZeRO-3 / TP."""
    names = ("pt-dist-ddp", "zero-3", "tp")
    if not all(n in rows for n in names):
        return []
    r = [rows[n] for n in names]
    big = max(devices)
    scale = [x["scale"].get(str(big), 0) for x in r]
    out = []
    words = {"~10B": 0, "~1T": 1}
    out.append(("parameter scale", SEED_TRAINING["parameter scale"],
                [f"{_fmt_params(s)} ({big} devices)" for s in scale],
                _order_agrees(scale, SEED_TRAINING["parameter scale"], words),
                "the largest model whose parameters, gradients and Adam states fit 80 GB per device, from the "
                "measured bytes per parameter; TP alone stops at 8-way (one node), the seed's ~1T is TP with PP"))
    volume = [x["volume_psi"] for x in r]
    tokens, h = shape["batch"] * shape["seq"], shape["hidden"]
    out.append(("communication cost", SEED_TRAINING["communication cost"],
                [f"{v:.2f}x param bytes/step" for v in volume],
                _order_agrees(volume, SEED_TRAINING["communication cost"], {"low": 0, "medium": 1, "high": 2}),
                f"volume per rank per step over the model's fp32 bytes. Per layer TP moves 8 b*s*h where DDP moves "
                f"2 x 12h^2, a ratio of b*s/(3h): {tokens / (3 * h):.1f} here ({tokens} tokens per step, h = {h}), "
                f"{1536 * 2048 / (3 * 12288):.0f} at GPT-3 175B's 1536 x 2048 tokens and h = 12288; TP's all-reduces "
                f"also sit on the critical path, DDP's and ZeRO's overlap backward"))
    per_rank = [x["state_total"] / x["psi"] for x in r]
    big_split = [formulas.bytes_per_device(n, x, x["psi"], world, big) for n, x in zip(names, r)]
    out.append(("memory efficiency", SEED_TRAINING["memory efficiency"],
                [f"{b:.1f} B/param per rank here, {d:.2f} at {big} devices" for b, d in zip(per_rank, big_split)],
                _order_agrees([-d for d in big_split], SEED_TRAINING["memory efficiency"],
                              {"low": 0, "medium": 1, "high": 2}),
                f"parameter + gradient + optimizer bytes per device per parameter: measured at the run's world size, "
                f"then split as each strategy splits them over {big} devices (TP at most 8-way)"))
    loc = [x["loc"] or 0 for x in r]
    out.append(("implementation complexity", SEED_TRAINING["implementation complexity"],
                [f"{n} lines" for n in loc],
                _order_agrees(loc, SEED_TRAINING["implementation complexity"], {"low": 0, "medium": 1, "high": 2}),
                "code lines (no blanks, comments, docstrings) of the files that implement it here (TP: with the "
                "attention and MLP written for it)"))
    return out


def charts(out: Path, rows: list[dict]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["label"] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    bottom = [0.0] * len(rows)
    for kind in KINDS:
        vals = [r[kind] / MB for r in rows]
        ax.barh(labels, vals, left=bottom, label=kind.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals)]
    off = [r["offload"] / MB for r in rows]
    if any(off):
        ax.barh(labels, off, left=bottom, label="offloaded to CPU", hatch="//", alpha=0.4)
    ax.set_xlabel("MB per rank (summed tensor bytes)")
    ax.set_title("Memory per rank by strategy")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "memory_per_rank.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.barh(labels, [r["volume"] / MB for r in rows], color="tab:purple")
    ax.set_xlabel("MB moved per rank per step (volume, ZeRO paper's counting)")
    ax.set_title("Communication per step")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out / "communication.png", dpi=120)
    plt.close(fig)
    return ["memory_per_rank.png", "communication.png"]


def _md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write(out: Path, meta: dict, results: dict, inference: dict | None) -> str:
    out.mkdir(parents=True, exist_ok=True)
    rows = training_rows(results)
    by_name = {r["name"]: r for r in rows}
    (out / "results.json").write_text(json.dumps({"meta": meta, "training": results, "inference": inference},
                                                 indent=2, default=str))
    if rows:
        charts(out, rows)
    md = [f"# miniframes compare\n\n{meta['description']}\n"]
    md.append("## Training: memory per rank (MB, summed tensor bytes)\n")
    md.append(_md_table(["strategy", "params", "grads", "optimizer", "peak activations", "offloaded",
                         "formula (params+grads+optimizer)"],
                        [[r["label"], f"{r['parameters'] / MB:.2f}", f"{r['gradients'] / MB:.2f}",
                          f"{r['optimizer_states'] / MB:.2f}", f"{r['activations'] / MB:.2f}",
                          f"{r['offload'] / MB:.2f}", results[r["name"]].get("memory_formula", "")]
                         for r in rows]))
    md.append("\n![memory per rank](memory_per_rank.png)\n")
    md.append("## Training: communication per step (per rank)\n")
    md.append(_md_table(["strategy", "collectives", "volume MB", "volume / param bytes", "paper", "ring wire MB",
                         "exact count check"],
                        [[r["label"], f"{r['collectives']:.0f}", f"{r['volume'] / MB:.2f}", f"{r['volume_psi']:.2f}",
                          results[r["name"]].get("paper_volume", ""), f"{r['wire'] / MB:.2f}",
                          results[r["name"]].get("exact_check", "")] for r in rows]))
    notes = [f"- {STRATEGIES[n][2]}: {NOTES[n]}" for n in results if n in NOTES]
    if notes:
        md.append("\n" + "\n".join(notes))
    md.append("\n![communication](communication.png)\n")
    md.append("## Training: step time, communication share, lines of code, scale\n")
    devices = meta["devices"]
    md.append(_md_table(["strategy", "step (median s)", "blocked in communication", "lines of code"]
                        + [f"largest model, 80 GB x {d}" for d in devices],
                        [[r["label"], f"{r['step']:.3f}",
                          "not visible (waits in C++)" if r["comm_share"] is None else f"{r['comm_share']:.0%}",
                          r["loc"] if r["loc"] is not None else "peer (not counted)"]
                         + [_fmt_params(r["scale"].get(str(d), 0)) for d in devices] for r in rows]))
    md.append(f"\nScale assumptions: {meta['scale_assumptions']}\n")
    md.append("## The seed's training table, cell by cell (DDP / ZeRO-3 / Megatron TP)\n")
    seed = seed_comparison(by_name, devices, meta["shape"], meta["world_size"])
    md.append(_md_table(["feature", "seed", "measured", "agrees", "how it is measured"],
                        [[f, " / ".join(s), " / ".join(m), "yes" if a else "no", why] for f, s, m, a, why in seed])
              if seed else "(needs pt-dist-ddp, zero-3 and tp in the run)")
    if inference:
        md.append("\n## Inference\n")
        md.append(f"{inference['requests']} requests, prompts {inference['prompt_lengths'][0]}-"
                  f"{inference['prompt_lengths'][1]} tokens, {inference['max_tokens']} new tokens each (greedy); "
                  f"static batches of {inference['batch_size']}; median of {inference['repeats']} interleaved runs; "
                  f"KV budget {inference['kv_budget_tokens']} token slots for the concurrency column.\n")
        eng = inference["engines"]

        def cell(v, f):
            return "not exposed" if v is None else f.format(v)

        md.append(_md_table(["engine", "tokens/s", "KV waste", "max concurrent at budget", "p50 s", "p99 s"],
                            [[k, f"{v['throughput']:.0f}", cell(v["kv_waste"], "{:.1%}"),
                              cell(v["max_concurrent"], "{}"), cell(v["p50"], "{:.2f}"), cell(v["p99"], "{:.2f}")]
                             for k, v in eng.items()]))
        paged, static = eng["paged-serve"], eng["transformers static batching"]
        md.append("\n| feature | seed (vLLM / TensorRT-LLM / TGI) | measured (paged-serve, vLLM's design) | agrees |"
                  "\n|---|---|---|---|")
        md.append(f"| memory efficiency | {' / '.join(SEED_INFERENCE['memory efficiency'])} | KV waste "
                  f"{paged['kv_waste']:.1%} vs static batching's {static['kv_waste']:.1%}; "
                  f"{paged['max_concurrent']} vs {static['max_concurrent']} sequences in the same KV budget | "
                  f"{'yes' if paged['kv_waste'] < static['kv_waste'] else 'no'} |")
        md.append(f"| throughput | {' / '.join(SEED_INFERENCE['throughput'])} | {paged['throughput']:.0f} vs "
                  f"{static['throughput']:.0f} tokens/s (static) | "
                  f"{'yes' if paged['throughput'] > static['throughput'] else 'no'} |")
        md.append("\nTensorRT-LLM and TGI need a CUDA GPU and their own installs; they were not run, so their "
                  "columns stay the seed's words.\n")
    md.append(f"\nCommand: `{meta['command']}`\n")
    text = "\n".join(md)
    (out / "report.md").write_text(text)
    return text


def terminal_summary(results: dict) -> str:
    rows = training_rows(results)
    head = f"{'strategy':<32}{'state MB/rank':>14}{'act MB':>9}{'comm MB/step':>14}{'x param':>9}{'step s':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['label']:<32}{r['state_total'] / MB:>14.2f}{r['activations'] / MB:>9.2f}"
                     f"{r['volume'] / MB:>14.2f}{r['volume_psi']:>9.2f}{r['step']:>9.3f}")
    return "\n".join(lines)

