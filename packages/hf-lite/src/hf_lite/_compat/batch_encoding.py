"""BatchEncoding and how token ids become one (transformers' ``BatchEncoding``, ``_batch_encode_plus`` and
``pad``): each example is truncated into windows, wrapped in the template's special tokens, then the rows are padded
and turned into lists, ``torch`` or ``numpy`` tensors."""

from __future__ import annotations

from collections import UserDict

import numpy as np
import torch

from .tokenization_padding import VERY_LARGE_INTEGER, pad_rows, truncate, warn_if_too_long


class BatchEncoding(UserDict):
    """Dict of model inputs (``input_ids``, ``attention_mask``...) with attribute access and ``.to(device)``."""

    def __getattr__(self, item):
        try:
            return self.data[item]
        except KeyError as err:
            raise AttributeError(item) from err

    def to(self, device, *, non_blocking: bool = False) -> BatchEncoding:
        self.data = {k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
                     for k, v in self.data.items()}
        return self

    def convert_to_tensors(self, tensor_type: str | None) -> BatchEncoding:
        if tensor_type is None:
            return self
        if tensor_type not in ("pt", "np"):
            raise ValueError(f"return_tensors={tensor_type!r}: use 'pt', 'np' or None (lists)")
        for key, value in self.data.items():
            rows = value if isinstance(value, list) else [value]
            if rows and isinstance(rows[0], list) and len({len(r) for r in rows}) > 1:
                raise ValueError(
                    "Unable to create tensor, you should probably activate truncation and/or padding with "
                    f"'padding=True' 'truncation=True' to have batched tensors with the same length ({key!r} here)."
                )
            self.data[key] = torch.tensor(value, dtype=torch.long) if tensor_type == "pt" else np.array(value)
        return self


def encode_rows(
    tokenizer, ids_a, ids_b, *, add_special_tokens, truncation, max_length, stride, return_overflowing_tokens, side
) -> tuple[dict[str, list], list[int]]:
    """Rows of ids / token type ids / special-token masks for each example, and the example each row came from
    (``truncation`` and ``max_length`` as ``padding_truncation_strategies`` resolved them)."""
    strategy, limit = truncation, VERY_LARGE_INTEGER if max_length is None else max_length
    rows = {"input_ids": [], "token_type_ids": [], "special_tokens_mask": []}
    sample = []
    for i, (a, b) in enumerate(zip(ids_a, ids_b)):
        n_special = tokenizer.num_special_tokens_to_add(pair=b is not None) if add_special_tokens else 0
        if strategy is not None and limit < n_special:
            raise ValueError(
                f"max_length={limit} is below the {n_special} special tokens this tokenizer adds; nothing would be "
                "left of the text"
            )
        windows_a, windows_b = truncate(a, b, strategy, limit - n_special, stride, side)
        if return_overflowing_tokens and b is not None and len(windows_a) > 1 and len(windows_b) > 1:
            raise ValueError(
                "return_overflowing_tokens with both sequences of a pair truncated: use "
                "truncation='only_first' or 'only_second'"
            )
        pairs = [(wa, None if b is None else windows_b[0]) for wa in windows_a]
        if b is not None and len(windows_b) > 1:
            pairs = [(windows_a[0], wb) for wb in windows_b]
        for wa, wb in pairs if return_overflowing_tokens else pairs[:1]:
            if add_special_tokens:
                ids, types, special = tokenizer._template.apply(wa, wb)
            else:
                ids = wa + (wb or [])
                types, special = [0] * len(wa) + [1] * len(wb or []), [0] * len(ids)
            rows["input_ids"].append(ids)
            rows["token_type_ids"].append(types)
            rows["special_tokens_mask"].append(special)
            sample.append(i)
    return rows, sample


def finish_rows(
    tokenizer,
    rows: dict[str, list],
    *,
    batched,
    padding,
    max_length,
    pad_to_multiple_of,
    padding_side,
    return_tensors,
    return_attention_mask,
    return_token_type_ids,
    return_special_tokens_mask,
    return_length,
    overflow_to_sample=None,
    check_length=False,
) -> BatchEncoding:
    """Pick the requested keys, pad, add lengths, and make tensors (shared by ``__call__`` and ``pad``); ``padding``
    and ``max_length`` as ``padding_truncation_strategies`` resolved them."""
    names = tokenizer.model_input_names
    main = names[0]
    keep = {main}
    if return_attention_mask if return_attention_mask is not None else "attention_mask" in names:
        keep.add("attention_mask")
        if "attention_mask" not in rows:
            rows = {**rows, "attention_mask": [[1] * len(x) for x in rows[main]]}
    if return_token_type_ids if return_token_type_ids is not None else "token_type_ids" in names:
        keep.add("token_type_ids")
    if return_special_tokens_mask:
        keep.add("special_tokens_mask")
    data = {k: v for k, v in rows.items() if k in keep or k not in ("token_type_ids", "special_tokens_mask")}
    data = pad_rows(
        data, padding, max_length, pad_to_multiple_of, padding_side or tokenizer.padding_side, tokenizer.pad_token_id,
        main
    )
    if check_length:
        warn_if_too_long(tokenizer, data[main], max_length)
    if return_length:
        data["length"] = [len(x) for x in data[main]]
    if overflow_to_sample is not None:
        data["overflow_to_sample_mapping"] = overflow_to_sample
    elif not batched:
        # One example: rows collapse to the row (transformers keeps "length" a list for fast tokenizers).
        data = {k: v if k == "length" else v[0] for k, v in data.items()}
        if return_tensors is not None:
            data = {k: v if k == "length" else [v] for k, v in data.items()}
    return BatchEncoding(data).convert_to_tensors(return_tensors)


def as_rows(encoded_inputs, main: str) -> tuple[dict[str, list], bool]:
    """``pad``'s input (a dict of lists, one dict, or a list of dicts, lists or tensors) as a dict of rows."""
    if isinstance(encoded_inputs, (list, tuple)):
        if not encoded_inputs or not isinstance(encoded_inputs[0], (dict, UserDict)):
            raise ValueError("pad() takes a dict of lists, or a list of dicts (one per example)")
        encoded_inputs = {k: [example[k] for example in encoded_inputs] for k in encoded_inputs[0]}
    if main not in encoded_inputs:
        raise ValueError(f"You should supply an encoding with {main!r}, got {sorted(encoded_inputs)}")

    def plain(value):
        return value.tolist() if isinstance(value, (torch.Tensor, np.ndarray)) else value

    rows = {k: plain(v) for k, v in dict(encoded_inputs).items()}
    first = rows[main][0] if rows[main] else []
    batched = isinstance(plain(first), (list, tuple))
    rows = {k: [plain(x) for x in v] if batched else [v] for k, v in rows.items()}
    return rows, batched
