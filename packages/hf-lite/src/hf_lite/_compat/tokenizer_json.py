"""The byte-level BPE part of the ``tokenizers`` library's tokenizer.json, read into ``ByteLevelBPE`` arguments
(``GPT2Tokenizer`` writes it back: ``_compat/tokenization_gpt2.py``).

Two pre-tokenizers are byte-level BPE: GPT-2's (``ByteLevel`` with its built-in regex) and the Llama 3 / GPT-4 kind
(``Sequence[Split(regex, "Isolated"), ByteLevel(use_regex=False)]``); the regex is all that differs.
"""

from __future__ import annotations

from ..byte_level_bpe import GPT2_SPLIT_PATTERN


def _split_pattern(pre: dict, path: str) -> tuple[str, bool]:
    """(regex, add_prefix_space) of a byte-level pre-tokenizer; anything else is refused by name."""
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return GPT2_SPLIT_PATTERN, steps[0].get("add_prefix_space", False)
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        split = steps[0]
        pattern = split.get("pattern", {})
        if "Regex" in pattern and split.get("behavior") == "Isolated" and not split.get("invert", False):
            return pattern["Regex"], steps[1].get("add_prefix_space", False)
    name = pre.get("type") if pre.get("type") != "Sequence" else f"Sequence of {kinds}"
    raise ValueError(
        f"{path}: pre_tokenizer {name!r} is not a byte-level BPE one (ByteLevel, or Split(Regex, 'Isolated') + "
        "ByteLevel(use_regex=False)); PreTrainedTokenizerFast reads any tokenizer.json"
    )


def read_byte_level_bpe(spec: dict, path: str) -> dict:
    """``GPT2Tokenizer(**read_byte_level_bpe(json.load(f), path))``."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"{path}: model type {model.get('type')!r} is not BPE; GPT2Tokenizer reads byte-level BPE")
    if spec.get("normalizer") is not None:
        raise ValueError(f"{path}: normalizer {spec['normalizer'].get('type')!r} is not supported by GPT2Tokenizer")
    for key in ("continuing_subword_prefix", "end_of_word_suffix", "dropout"):
        if model.get(key):
            raise ValueError(f"{path}: BPE {key}={model[key]!r} is not supported by GPT2Tokenizer")
    if model.get("unk_token") is not None:  # byte-level BPE has every byte; GPT2Tokenizer drops what is not
        raise ValueError(f"{path}: BPE unk_token={model['unk_token']!r} is not supported by GPT2Tokenizer")
    if model.get("byte_fallback"):
        raise ValueError(f"{path}: BPE byte_fallback is not byte-level BPE; use PreTrainedTokenizerFast")
    pattern, add_prefix_space = _split_pattern(spec.get("pre_tokenizer") or {}, path)
    added = [{"content": t["content"], "id": t["id"],
              "special": t.get("special", False)} for t in spec.get("added_tokens", [])]
    return {"vocab": model["vocab"], "merges": model["merges"], "added_tokens": added,
            "add_prefix_space": add_prefix_space, "split_pattern": pattern,
            "ignore_merges": model.get("ignore_merges", False), "post_processor": spec.get("post_processor")}
