"""Tokenise a JSON-lines file into Megatron's ``.bin``/``.idx`` pair (Megatron-LM's ``tools/preprocess_data.py``,
its flag names; one process, no sentence splitting).

    python -m mega_par.tools.preprocess_data --input docs.jsonl --output-prefix out \\
        --tokenizer-type HuggingFaceTokenizer --tokenizer-model <hf dir> --append-eod --workers 1

writes ``out_text_document.bin`` / ``.idx``: one document per line, one sequence per document.
"""

from __future__ import annotations

import argparse
import json

from mega_par._compat.datasets.indexed_dataset import DType, IndexedDatasetBuilder
from mega_par._compat.tokenizers.megatron_tokenizer import MegatronTokenizer


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", required=True, help="JSON-lines file, one document per line")
    p.add_argument("--json-keys", nargs="+", default=["text"])
    p.add_argument("--append-eod", action="store_true", help="Append an <eod> token to the end of a document.")
    p.add_argument("--output-prefix", required=True)
    p.add_argument("--tokenizer-type", required=True, choices=["HuggingFaceTokenizer", "NullTokenizer"])
    p.add_argument("--tokenizer-model", help="Hugging Face tokenizer directory")
    p.add_argument("--vocab-size", type=int, help="NullTokenizer's vocabulary size")
    p.add_argument("--workers", type=int, default=1, help="accepted for Megatron's command lines; one process")
    p.add_argument("--log-interval", type=int, default=1000)
    args = p.parse_args(argv)
    if args.tokenizer_type == "HuggingFaceTokenizer" and not args.tokenizer_model:
        p.error("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model")
    if args.tokenizer_type == "NullTokenizer" and not args.vocab_size:
        p.error("--tokenizer-type NullTokenizer needs --vocab-size")
    return args


def main(argv=None) -> dict:
    """Returns {json key: output prefix} of what it wrote."""
    args = get_args(argv)
    if args.tokenizer_type == "HuggingFaceTokenizer":
        tokenizer = MegatronTokenizer.from_pretrained(args.tokenizer_model)
    else:
        tokenizer = MegatronTokenizer.from_pretrained(metadata_path={"library": "null-text"},
                                                      vocab_size=args.vocab_size)
    prefixes = {key: f"{args.output_prefix}_{key}_document" for key in args.json_keys}
    builders = {key: IndexedDatasetBuilder(prefixes[key] + ".bin", dtype=DType.optimal_dtype(tokenizer.vocab_size))
                for key in args.json_keys}
    with open(args.input) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            doc = json.loads(line)
            for key in args.json_keys:
                if key not in doc:
                    raise KeyError(f"{args.input}:{lineno}: no key {key!r} (--json-keys {args.json_keys})")
                sentences = doc[key] if isinstance(doc[key], list) else [doc[key]]
                ids, lens = [], []
                for sentence in sentences:
                    s_ids = tokenizer.tokenize(sentence)
                    if s_ids:
                        ids.extend(s_ids)
                        lens.append(len(s_ids))
                if ids and args.append_eod:  # as upstream: eod joins the document's last sentence
                    ids.append(tokenizer.eod)
                    lens[-1] += 1
                builders[key].add_document(ids, lens)
    for key, builder in builders.items():
        builder.finalize(prefixes[key] + ".idx")
    return prefixes

