"""Batching examples into model inputs (transformers' ``data/data_collator.py``): ``default_data_collator``
(``DefaultDataCollator``), ``DataCollatorWithPadding`` and ``DataCollatorForLanguageModeling`` with ``mlm=False``
(causal LM labels)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


def _as_dicts(features) -> list[Mapping]:
    if not features:
        raise ValueError("a data collator got an empty list of features")
    return [f if isinstance(f, Mapping) else vars(f) for f in features]


def default_data_collator(features: list, return_tensors: str = "pt") -> dict[str, Any]:
    """Stack same-shaped features into tensors; ``label`` / ``label_ids`` become ``labels``; strings and None are
    left out. No padding: use ``DataCollatorWithPadding`` for examples of different lengths."""
    if return_tensors != "pt":
        raise ValueError(f"return_tensors={return_tensors!r}: hf-lite collates to torch tensors only ('pt')")
    features = _as_dicts(features)
    first, batch = features[0], {}
    if first.get("label") is not None:
        label = first["label"].item() if torch.is_tensor(first["label"]) else first["label"]
        dtype = torch.long if isinstance(label, int) else torch.float
        batch["labels"] = torch.tensor([f["label"] for f in features], dtype=dtype)
    elif first.get("label_ids") is not None:
        if torch.is_tensor(first["label_ids"]):
            batch["labels"] = torch.stack([f["label_ids"] for f in features])
        else:
            dtype = torch.long if isinstance(first["label_ids"][0], int) else torch.float
            batch["labels"] = torch.tensor([f["label_ids"] for f in features], dtype=dtype)
    for key, value in first.items():
        if key in ("label", "label_ids") or value is None or isinstance(value, str):
            continue
        try:
            if torch.is_tensor(value):
                batch[key] = torch.stack([f[key] for f in features])
            else:
                batch[key] = torch.tensor([f[key] for f in features])
        except (RuntimeError, ValueError) as err:
            raise ValueError(
                f"default_data_collator cannot stack {key!r} (examples of different lengths?): {err}. "
                "Use DataCollatorWithPadding or DataCollatorForLanguageModeling."
            ) from None
    return batch


@dataclass
class DefaultDataCollator:
    """``default_data_collator`` as an object (transformers' ``DefaultDataCollator``)."""

    return_tensors: str = "pt"

    def __call__(self, features: list, return_tensors: str | None = None) -> dict[str, Any]:
        return default_data_collator(features, return_tensors or self.return_tensors)


@dataclass
class DataCollatorWithPadding:
    """Pad a batch with ``tokenizer.pad`` (to the longest, ``max_length`` or a multiple); ``label(_ids)`` -> labels."""

    tokenizer: Any
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.tokenizer.pad(
            _as_dicts(features),
            padding=self.padding,
            max_length=self.max_length,
            pad_to_multiple_of=self.pad_to_multiple_of,
            return_tensors=self.return_tensors,
        )
        batch = dict(batch)
        for old in ("label", "label_ids"):
            if old in batch:
                batch["labels"] = batch.pop(old)
        return batch


def _collate_ids(examples, tokenizer, pad_to_multiple_of: int | None) -> torch.Tensor:
    """Lists/tensors of ids -> one tensor, padded on the tokenizer's side when lengths differ."""
    examples = [e if torch.is_tensor(e) else torch.tensor(e, dtype=torch.long) for e in examples]
    length = max(e.size(0) for e in examples)
    same = all(e.size(0) == length for e in examples)
    if same and (pad_to_multiple_of is None or length % pad_to_multiple_of == 0):
        return torch.stack(examples)
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"You are attempting to pad samples but the tokenizer you are using "
            f"({type(tokenizer).__name__}) does not have a pad token."
        )
    if pad_to_multiple_of is not None and length % pad_to_multiple_of:
        length = (length // pad_to_multiple_of + 1) * pad_to_multiple_of
    result = examples[0].new_full((len(examples), length), tokenizer.pad_token_id)
    for i, e in enumerate(examples):
        if tokenizer.padding_side == "right":
            result[i, : e.shape[0]] = e
        else:
            result[i, -e.shape[0] :] = e
    return result


@dataclass
class DataCollatorForLanguageModeling:
    """Causal-LM batches (``mlm=False``): pad, then ``labels`` = ``input_ids`` with pad tokens set to -100 (the
    model shifts them). Masked-LM (``mlm=True``) is not part of hf-lite and raises."""

    tokenizer: Any
    mlm: bool = True
    whole_word_mask: bool = False  # the masking options (to seed) only act with mlm=True
    mlm_probability: float | None = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"
    seed: int | None = None

    def __post_init__(self):
        if self.mlm:
            raise ValueError(
                "DataCollatorForLanguageModeling(mlm=True): hf-lite has no masked-LM models; pass "
                "mlm=False for causal language modeling"
            )
        if self.return_tensors != "pt":
            raise ValueError(f"return_tensors={self.return_tensors!r}: hf-lite collates to torch tensors only ('pt')")

    def __call__(self, examples: list) -> dict[str, Any]:
        if isinstance(examples[0], Mapping):
            batch = dict(
                self.tokenizer.pad(list(examples), return_tensors="pt", pad_to_multiple_of=self.pad_to_multiple_of)
            )
        else:
            batch = {"input_ids": _collate_ids(examples, self.tokenizer, self.pad_to_multiple_of)}
        batch.pop("special_tokens_mask", None)
        labels = batch["input_ids"].clone()
        if self.tokenizer.pad_token_id is not None:
            labels[labels == self.tokenizer.pad_token_id] = -100
        batch["labels"] = labels
        return batch

    def torch_call(self, examples: list) -> dict[str, Any]:
        return self(examples)
