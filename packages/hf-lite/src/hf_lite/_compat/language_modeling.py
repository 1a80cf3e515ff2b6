"""A tokenised corpus cut into fixed-length blocks for causal-LM training: ``group_texts`` as in transformers'
``examples/pytorch/language-modeling/run_clm.py``, as a map-style dataset, and streamed as an iterable one."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.utils.data import Dataset, IterableDataset


def group_texts(examples: dict[str, list[list[int]]], block_size: int) -> dict[str, list[list[int]]]:
    """Concatenate every column and cut it into ``block_size`` chunks; the remainder shorter than a block is
    dropped (run_clm.py's choice: no padding inside the corpus). ``labels`` are a copy of ``input_ids``."""
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be a positive integer")
    concatenated = {k: [t for row in v for t in row] for k, v in examples.items()}
    total = (len(next(iter(concatenated.values()))) // block_size) * block_size if concatenated else 0
    result = {k: [t[i : i + block_size] for i in range(0, total, block_size)] for k, t in concatenated.items()}
    if "input_ids" in result:
        result["labels"] = [list(block) for block in result["input_ids"]]
    return result


def _tokenize(tokenizer, texts: Iterable[str], append_eos: bool) -> Iterable[list[int]]:
    eos = tokenizer.eos_token_id if append_eos else None
    for text in texts:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        yield ids + [eos] if eos is not None else ids


class GroupedTextsDataset(Dataset):
    """Map-style: the texts tokenised once (EOS between documents when ``append_eos``), grouped into blocks."""

    def __init__(self, tokenizer, texts: Iterable[str], block_size: int, append_eos: bool = True):
        grouped = group_texts({"input_ids": list(_tokenize(tokenizer, texts, append_eos))}, block_size)
        if not grouped["input_ids"]:
            raise ValueError(f"the corpus has fewer tokens than one block of block_size={block_size}")
        self.blocks = torch.tensor(grouped["input_ids"], dtype=torch.long)

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i].clone()}


class IterableGroupedTextsDataset(IterableDataset):
    """Iterable: texts are tokenised as they stream in and blocks are yielded as soon as they fill, so the corpus
    never has to fit in memory. Sharding across ranks is the Trainer's (``IterableDatasetShard``)."""

    def __init__(self, tokenizer, texts: Iterable[str], block_size: int, append_eos: bool = True):
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size={block_size!r} must be a positive integer")
        self.tokenizer, self.texts, self.block_size, self.append_eos = tokenizer, texts, block_size, append_eos

    def __iter__(self):
        buffer: list[int] = []
        for ids in _tokenize(self.tokenizer, self.texts, self.append_eos):
            buffer.extend(ids)
            while len(buffer) >= self.block_size:
                block = torch.tensor(buffer[: self.block_size], dtype=torch.long)
                buffer = buffer[self.block_size :]
                yield {"input_ids": block, "labels": block.clone()}
