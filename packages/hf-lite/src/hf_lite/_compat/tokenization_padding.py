"""Truncation (with overflowing windows) and padding of token-id rows (transformers' ``TruncationStrategy`` /
``PaddingStrategy``, computed the way the Rust ``tokenizers`` does it, which is what transformers 5 runs).

Truncation leaves room for the special tokens the template adds afterwards. ``stride`` makes consecutive windows
of an overflowing sequence overlap by that many tokens. Padding fills every row to one length and builds the
attention mask (0 on padding).
"""

from __future__ import annotations

import logging
import warnings

logger = logging.getLogger(__name__)

VERY_LARGE_INTEGER = int(1e30)
LARGE_INTEGER = int(1e20)  # a model_max_length above it means the tokenizer knows no maximum length
# What each padded key is filled with (transformers' ``_pad``); other keys (labels) are left as they are.
PAD_VALUES = {"attention_mask": 0, "token_type_ids": 0, "special_tokens_mask": 1}
_TRUNCATION = {
    True: "longest_first",
    "longest_first": "longest_first",
    "only_first": "only_first",
    "only_second": "only_second",
}


def truncation_strategy(truncation) -> str | None:
    if truncation in (None, False, "do_not_truncate"):
        return None
    if truncation not in _TRUNCATION:
        raise ValueError(f"truncation={truncation!r}: use True, 'longest_first', 'only_first', 'only_second' or False")
    return _TRUNCATION[truncation]


def padding_strategy(padding) -> str | None:
    if padding in (False, None, "do_not_pad"):
        return None
    if padding in (True, "longest"):
        return "longest"
    if padding == "max_length":
        return "max_length"
    raise ValueError(f"padding={padding!r}: use True, 'longest', 'max_length' or False")


def padding_truncation_strategies(tokenizer, padding, truncation, max_length, pad_to_multiple_of):
    """(padding, truncation, max_length) as they are applied (transformers' ``_get_padding_truncation_strategies``,
    the rules of its ``pad_truncation.md``): ``max_length`` alone turns truncation on; without ``max_length``, padding
    to ``'max_length'`` and truncation use ``model_max_length``, and do nothing when the tokenizer has none."""
    if max_length is not None and padding is False and truncation is None:
        truncation = "longest_first"
    if padding is True and max_length is not None and truncation in (None, False, "do_not_truncate"):
        warnings.warn("`max_length` is ignored when `padding`=`True` and there is no truncation strategy. To pad to "
                      "max length, use `padding='max_length'`.", stacklevel=3)
    padding, truncation = padding_strategy(padding), truncation_strategy(truncation)
    known = tokenizer.model_max_length <= LARGE_INTEGER
    if max_length is None and padding == "max_length":
        padding, max_length = (padding, tokenizer.model_max_length) if known else (None, None)
    if max_length is None and truncation is not None:
        truncation, max_length = (truncation, tokenizer.model_max_length) if known else (None, max_length)
    if padding is not None and tokenizer.pad_token_id is None:
        raise ValueError(
            "Asking to pad but the tokenizer does not have a padding token. Please select a token to use as "
            "`pad_token` `(tokenizer.pad_token = tokenizer.eos_token e.g.)` or add a new pad token via "
            "`tokenizer.add_special_tokens({'pad_token': '[PAD]'})`."
        )
    if truncation and padding and pad_to_multiple_of is not None and max_length % pad_to_multiple_of:
        raise ValueError("Truncation and padding are both activated but truncation length "
                         f"({max_length}) is not a multiple of pad_to_multiple_of ({pad_to_multiple_of}).")
    return padding, truncation, max_length


def warn_if_too_long(tokenizer, rows: list[list[int]], max_length) -> None:
    """transformers' ``_eventual_warn_about_too_long_sequence``: once per tokenizer, for the first (padded) row longer
    than ``model_max_length`` when no ``max_length`` applied."""
    flags = tokenizer.__dict__.setdefault("deprecation_warnings", {})
    key = "sequence-length-is-longer-than-the-specified-maximum"
    for row in rows:
        if max_length is None and len(row) > tokenizer.model_max_length and tokenizer.model_max_length != 0:
            if not flags.get(key):
                logger.warning("Token indices sequence length is longer than the specified maximum sequence length "
                               f"for this model ({len(row)} > {tokenizer.model_max_length}). Running this sequence "
                               "through the model will result in indexing errors")
            flags[key] = True


def windows(ids: list[int], max_len: int, stride: int, side: str) -> list[list[int]]:
    """The kept part, then the overflowing windows (tokenizers' ``Encoding::truncate``)."""
    if len(ids) <= max_len:
        return [ids]
    if max_len == 0:
        return [[], ids]
    if stride >= max_len:
        raise ValueError(f"stride={stride} must be smaller than the {max_len} tokens a window keeps")
    offset, out = max_len - stride, []
    if side == "right":
        for start in range(0, len(ids), offset):
            out.append(ids[start : start + max_len])
            if start + max_len >= len(ids):
                break
    else:
        for stop in range(len(ids), 0, -offset):
            out.append(ids[max(0, stop - max_len) : stop])
            if stop <= max_len:
                break
    return out


def truncate(ids_a, ids_b, strategy, limit: int, stride: int, side: str):
    """Windows of each sequence so that both fit ``limit`` tokens (special tokens already taken off)."""
    if strategy is None or len(ids_a) + len(ids_b or []) <= limit:
        return [ids_a], None if ids_b is None else [ids_b]
    if ids_b is None:
        if strategy == "only_second":  # the Rust tokenizers' words, which transformers 5 shows
            raise ValueError("Truncation error: Second sequence not provided")
        return windows(ids_a, limit, stride, side), None
    if strategy == "longest_first":
        # The shorter one keeps its length when the longer alone can make room; otherwise both get half.
        n1, n2 = sorted((len(ids_a), len(ids_b)))
        n2 = n1 if n1 > limit else max(n1, limit - n1)
        if n1 + n2 > limit:
            n1, n2 = limit // 2, limit // 2 + limit % 2
        if len(ids_a) > len(ids_b):
            n1, n2 = n2, n1
        return windows(ids_a, n1, stride, side), windows(ids_b, n2, stride, side)
    target = ids_a if strategy == "only_first" else ids_b
    to_remove = len(ids_a) + len(ids_b) - limit
    if len(target) <= to_remove:
        raise ValueError("Truncation error: Sequence to truncate too short to respect the provided max_length")
    kept = windows(target, len(target) - to_remove, stride, side)
    return (kept, [ids_b]) if strategy == "only_first" else ([ids_a], kept)


def pad_rows(rows: dict[str, list[list]], strategy, max_length, pad_to_multiple_of, side, pad_token_id, main_key):
    """Pad every padded key of ``rows`` to one length; returns new lists."""
    if strategy is None:
        return rows
    if side not in ("left", "right"):
        raise ValueError(f"padding_side should be 'left' or 'right', got {side!r}")
    if strategy == "longest":
        target = max((len(x) for x in rows[main_key]), default=0)
    else:
        target = max_length
    if pad_to_multiple_of:
        target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
    values = {main_key: pad_token_id, **PAD_VALUES}
    out = dict(rows)
    for key, value in values.items():
        if key in rows:
            out[key] = [_pad(x, target - len(x), value, side) for x in rows[key]]
    return out


def _pad(row: list, n: int, value, side: str) -> list:
    if n <= 0:
        return list(row)
    return [value] * n + list(row) if side == "left" else list(row) + [value] * n
