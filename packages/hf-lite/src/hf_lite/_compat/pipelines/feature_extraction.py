"""``pipeline("feature-extraction")`` (transformers' ``pipelines/feature_extraction.py``): the model's first output
(a base model's ``last_hidden_state``) for each text, as nested lists or, with ``return_tensors=True``, a tensor."""

from __future__ import annotations

from typing import Any

from .base import Pipeline


class FeatureExtractionPipeline(Pipeline):
    """``tokenize_kwargs`` (or ``truncation=``) go to the tokenizer; each input gives ``[1, length, hidden]``."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(self, truncation=None, tokenize_kwargs=None, return_tensors=None, **kwargs):
        tokenize_kwargs = dict(tokenize_kwargs or {})
        if truncation is not None:
            if "truncation" in tokenize_kwargs:
                raise ValueError("truncation parameter defined twice (given as keyword argument as well as in "
                                 "tokenize_kwargs)")
            tokenize_kwargs["truncation"] = truncation
        postprocess_params = {} if return_tensors is None else {"return_tensors": return_tensors}
        return tokenize_kwargs, {}, postprocess_params

    def preprocess(self, inputs, **tokenize_kwargs) -> dict:
        return self.tokenizer(inputs, return_tensors="pt", **tokenize_kwargs)

    def _forward(self, model_inputs):
        return {"features": self.model(**model_inputs)[0]}

    def postprocess(self, model_outputs, return_tensors=False):
        features = model_outputs["features"]
        return features if return_tensors else features.tolist()

    def __call__(self, *args: str | list[str], **kwargs: Any) -> Any | list[Any]:
        return super().__call__(*args, **kwargs)
