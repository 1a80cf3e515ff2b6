"""The special tokens a tokenizer.json post-processor puts around one sequence or a pair (tokenizers'
``TemplateProcessing``; ``ByteLevel`` or no post-processor adds none and concatenates a pair), and transformers 5's
rewrite of it from ``add_bos_token`` / ``add_eos_token``."""

from __future__ import annotations

# A piece is ("special", token, type_id) or ("sequence", "A" | "B", type_id), as TemplateProcessing spells them.
Piece = tuple[str, str, int]
_PLAIN_SINGLE: list[Piece] = [("sequence", "A", 0)]
_PLAIN_PAIR: list[Piece] = [("sequence", "A", 0), ("sequence", "B", 1)]


def _parse(pieces: list[dict]) -> list[Piece]:
    out = []
    for piece in pieces:
        if "Sequence" in piece:
            out.append(("sequence", piece["Sequence"]["id"], piece["Sequence"]["type_id"]))
        else:
            out.append(("special", piece["SpecialToken"]["id"], piece["SpecialToken"]["type_id"]))
    return out


class SpecialTokensTemplate:
    """``apply(ids_a, ids_b)`` -> (ids, token_type_ids, special_tokens_mask) with the template's special tokens."""

    def __init__(self, single: list[Piece], pair: list[Piece], special_ids: dict[str, list[int]]):
        self.single, self.pair, self.special_ids = single, pair, special_ids

    @classmethod
    def from_post_processor(cls, post_processor: dict | None) -> SpecialTokensTemplate:
        kind = (post_processor or {}).get("type")
        if kind is None or kind == "ByteLevel":
            return cls(_PLAIN_SINGLE, _PLAIN_PAIR, {})
        if kind == "Sequence":
            steps = post_processor.get("processors", [])
            templates = [p for p in steps if p.get("type") == "TemplateProcessing"]
            others = {p.get("type") for p in steps} - {"TemplateProcessing", "ByteLevel"}
            if others or len(templates) > 1:
                raise ValueError(f"post_processor Sequence of {[p.get('type') for p in steps]} is not supported")
            return cls.from_post_processor(templates[0] if templates else None)
        if kind != "TemplateProcessing":
            raise ValueError(
                f"post_processor {kind!r} is not supported by hf-lite (TemplateProcessing, ByteLevel or none)"
            )
        special_ids = {k: list(v["ids"]) for k, v in post_processor.get("special_tokens", {}).items()}
        return cls(_parse(post_processor["single"]), _parse(post_processor["pair"]), special_ids)

    @classmethod
    def from_flags(cls, bos: str | None, eos: str | None, add_bos: bool, add_eos: bool, token_to_id):
        """transformers 5 replaces the whole template: [bos] $A [eos] (and the same around $B:1)."""
        for flag, token, name in ((add_bos, bos, "bos_token"), (add_eos, eos, "eos_token")):
            if flag and token is None:
                raise ValueError(f"add_{name}=True but the tokenizer has no {name}")
        single, pair = [], []
        for seq, type_id in (("A", 0), ("B", 1)):
            pieces = [("special", bos, type_id)] if add_bos else []
            pieces.append(("sequence", seq, type_id))
            pieces += [("special", eos, type_id)] if add_eos else []
            pair += pieces
            single = single or list(pieces)
        specials = {t: [token_to_id(t)] for t in (bos if add_bos else None, eos if add_eos else None) if t}
        return cls(single, pair, specials)

    @property
    def tokens(self) -> list[str]:
        return list(self.special_ids)

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        pieces = self.pair if pair else self.single
        return sum(len(self.special_ids[p[1]]) for p in pieces if p[0] == "special")

    def apply(self, ids_a: list[int], ids_b: list[int] | None = None) -> tuple[list[int], list[int], list[int]]:
        ids, types, special = [], [], []
        for kind, name, type_id in self.pair if ids_b is not None else self.single:
            part = self.special_ids[name] if kind == "special" else (ids_a if name == "A" else ids_b)
            ids += part
            types += [type_id] * len(part)
            special += [int(kind == "special")] * len(part)
        return ids, types, special

    def to_post_processor(self) -> dict:
        """The TemplateProcessing JSON the Rust library reads (for tokenizer.json)."""

        def dump(pieces):
            return [
                {"Sequence": {"id": n, "type_id": t}} if k == "sequence" else {"SpecialToken": {"id": n, "type_id": t}}
                for k, n, t in pieces
            ]

        special = {t: {"id": t, "ids": ids, "tokens": [t] * len(ids)} for t, ids in self.special_ids.items()}
        return {
            "type": "TemplateProcessing",
            "single": dump(self.single),
            "pair": dump(self.pair),
            "special_tokens": special,
        }
