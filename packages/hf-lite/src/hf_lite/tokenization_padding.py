"""Truncation and padding of token-id batches (transformers' ``PaddingStrategy`` / ``TruncationStrategy``).

Truncation leaves room for the special tokens the template adds afterwards; padding fills with ``pad_token_id`` on
the chosen side and builds the attention mask (0 on padding).
"""

from __future__ import annotations

VERY_LARGE_INTEGER = int(1e30)


def truncate_ids(ids: list[int], truncation, limit, n_special: int, side: str) -> list[int]:
    if truncation in (None, False, "do_not_truncate"):
        return ids
    if truncation not in (True, "longest_first", "only_first"):
        raise ValueError(f"truncation={truncation!r}: use True, 'longest_first', 'only_first' or False")
    if not isinstance(limit, int) or limit < n_special or limit < 0:
        raise ValueError(
            f"max_length={limit!r} is below the {n_special} special tokens this tokenizer adds; "
            "nothing would be left of the text"
        )
    keep = limit - n_special
    if len(ids) <= keep:
        return ids
    return ids[:keep] if side == "right" else ids[len(ids) - keep :]


def pad_batch(ids, masks, padding, max_length, pad_to_multiple_of, side, pad_token_id):
    """Return padded (ids, masks); ``max_length`` is only used for ``padding="max_length"``."""
    if padding in (False, None, "do_not_pad"):
        return ids, masks
    if padding in (True, "longest"):
        target = max(len(x) for x in ids)
    elif padding == "max_length":
        target = max_length
        if target is None or target >= VERY_LARGE_INTEGER:
            raise ValueError("padding='max_length' needs max_length (the tokenizer has no model_max_length)")
    else:
        raise ValueError(f"padding={padding!r}: use True, 'longest', 'max_length' or False")
    if pad_to_multiple_of:
        target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
    if side not in ("left", "right"):
        raise ValueError(f"padding_side should be 'left' or 'right', got {side!r}")
    if any(len(x) < target for x in ids) and pad_token_id is None:
        raise ValueError(
            "Asking to pad but the tokenizer does not have a padding token. Please select a token to use as "
            "`pad_token` `(tokenizer.pad_token = tokenizer.eos_token e.g.)` or add a new pad token via "
            "`tokenizer.add_special_tokens({'pad_token': '[PAD]'})`."
        )
    out_ids, out_masks = [], []
    for x, m in zip(ids, masks):
        n = max(0, target - len(x))
        pad_ids, pad_mask = [pad_token_id] * n, [0] * n
        out_ids.append(pad_ids + x if side == "left" else x + pad_ids)
        out_masks.append(pad_mask + m if side == "left" else m + pad_mask)
    return out_ids, out_masks
