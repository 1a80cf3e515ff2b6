"""Special tokens (transformers' ``SpecialTokensMixin``): ``bos_token`` ... ``mask_token`` and the additional ones,
their ids, and adding tokens that are never split."""

from __future__ import annotations

SPECIAL_TOKENS_ATTRIBUTES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


def _content(token) -> str | None:
    if token is None or isinstance(token, str):
        return token
    if isinstance(token, dict):
        return token["content"]
    return str(getattr(token, "content", token))


class SpecialTokensMixin:
    """Needs ``_special`` (attribute -> token), ``_additional_special_tokens``, ``_token_to_id`` and ``_add_tokens``."""

    def _require_known(self, token: str, attr: str) -> None:
        if self._token_to_id(token) is None:
            raise ValueError(
                f"{attr}={token!r} is not in the vocabulary nor an added token; add it first with "
                f"tokenizer.add_special_tokens({{{attr!r}: {token!r}}})"
            )

    def _set_special(self, attr: str, token: str) -> None:
        self._require_known(token, attr)
        self._special[attr] = token

    def __getattr__(self, name):
        special = self.__dict__.get("_special", {})
        if name in special:
            return special[name]
        if name.endswith("_token_id") and name[: -len("_id")] in special:
            token = special[name[: -len("_id")]]
            return None if token is None else self._token_to_id(token)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in SPECIAL_TOKENS_ATTRIBUTES and "_special" in self.__dict__:
            if value is None:
                self._special[name] = None
            else:
                self._set_special(name, _content(value))
            return
        super().__setattr__(name, value)

    @property
    def additional_special_tokens(self) -> list[str]:
        return list(self._additional_special_tokens)

    @property
    def special_tokens_map(self) -> dict:
        out = {k: v for k, v in self._special.items() if v is not None}
        if self._additional_special_tokens:
            out["additional_special_tokens"] = list(self._additional_special_tokens)
        return out

    @property
    def all_special_tokens(self) -> list[str]:
        tokens = [v for v in self._special.values() if v is not None] + self._additional_special_tokens
        return list(dict.fromkeys(tokens))

    @property
    def all_special_ids(self) -> list[int]:
        return [self._token_to_id(t) for t in self.all_special_tokens]

    def add_special_tokens(self, special_tokens_dict: dict, replace_extra_special_tokens: bool = True,
                           replace_additional_special_tokens: bool | None = None) -> int:
        """Add (if new) and assign special tokens; keys must be known attributes (like transformers).
        ``replace_additional_special_tokens`` is transformers 4's name of ``replace_extra_special_tokens``."""
        if replace_additional_special_tokens is None:
            replace_additional_special_tokens = replace_extra_special_tokens
        allowed = set(SPECIAL_TOKENS_ATTRIBUTES) | {"additional_special_tokens"}
        added = 0
        for key, value in special_tokens_dict.items():
            if key not in allowed:
                raise ValueError(f"Key {key!r} is not a special token attribute; use one of {sorted(allowed)}")
            if key == "additional_special_tokens":
                tokens = [_content(t) for t in value]
                added += self._add_tokens(tokens, special_tokens=True)
                if replace_additional_special_tokens:
                    self._additional_special_tokens = []
                self._additional_special_tokens += [t for t in tokens if t not in self._additional_special_tokens]
            else:
                token = _content(value)
                added += self._add_tokens([token], special_tokens=True)
                self._set_special(key, token)
        return added

    def add_tokens(self, new_tokens, special_tokens: bool = False) -> int:
        if isinstance(new_tokens, str) or not isinstance(new_tokens, (list, tuple)):
            new_tokens = [new_tokens]
        return self._add_tokens([_content(t) for t in new_tokens], special_tokens=special_tokens)

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            found = self._token_to_id(tokens)
            if found is None:
                unk = self._special["unk_token"]
                if unk is None:
                    raise KeyError(f"token {tokens!r} is not in the vocabulary and the tokenizer has no unk_token")
                return self._token_to_id(unk)
            return found
        return [self.convert_tokens_to_ids(t) for t in tokens]
