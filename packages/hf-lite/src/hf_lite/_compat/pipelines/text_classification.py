"""``pipeline("text-classification")`` / ``"sentiment-analysis"`` over the ``*ForSequenceClassification`` heads
(transformers' ``pipelines/text_classification.py``): a text (or a ``{"text", "text_pair"}`` pair) -> the labels of
``config.id2label`` with their scores, softmax / sigmoid / raw as the config's ``problem_type`` says."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from ...trainer_utils import ExplicitEnum
from ..models.auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING
from .base import Pipeline


class ClassificationFunction(ExplicitEnum):
    SIGMOID = "sigmoid"
    SOFTMAX = "softmax"
    NONE = "none"


def sigmoid(_outputs):
    return 1.0 / (1.0 + np.exp(-_outputs))


def softmax(_outputs):
    shifted = np.exp(_outputs - np.max(_outputs, axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class TextClassificationPipeline(Pipeline):
    """Scores of one text per call (or a list / dataset of them). ``top_k=1`` (not given) returns the best label as
    ``[{"label", "score"}]``; ``top_k=k`` the ``k`` best sorted, ``top_k=None`` all of them;
    ``function_to_apply`` overrides the config's choice. Tokenizer kwargs (``truncation``, ``max_length``...) go to
    the tokenizer."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True
    function_to_apply = ClassificationFunction.NONE

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.check_model_type(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING)

    def _sanitize_parameters(self, function_to_apply=None, top_k="", **tokenizer_kwargs):
        postprocess_params = {}
        if isinstance(top_k, int) or top_k is None:
            postprocess_params.update(top_k=top_k, _legacy=False)
        if isinstance(function_to_apply, str):
            function_to_apply = ClassificationFunction[function_to_apply.upper()]
        if function_to_apply is not None:
            postprocess_params["function_to_apply"] = function_to_apply
        return tokenizer_kwargs, {}, postprocess_params

    def __call__(self, inputs: str | list[str] | dict[str, str] | list[dict[str, str]], **kwargs: Any):
        result = super().__call__(inputs, **kwargs)
        return [result] if isinstance(inputs, str) and "top_k" not in kwargs else result

    def preprocess(self, inputs, **tokenizer_kwargs) -> dict:
        if isinstance(inputs, dict):
            return self.tokenizer(**inputs, return_tensors="pt", **tokenizer_kwargs)
        if isinstance(inputs, list) and len(inputs) == 1 and isinstance(inputs[0], list) and len(inputs[0]) == 2:
            return self.tokenizer(text=inputs[0][0], text_pair=inputs[0][1], return_tensors="pt", **tokenizer_kwargs)
        if isinstance(inputs, list):
            raise ValueError('The pipeline received invalid inputs, if you are trying to send text pairs, you can try '
                             'to send a dictionary `{"text": "My text", "text_pair": "My pair"}` in order to send a '
                             "text pair.")
        return self.tokenizer(inputs, return_tensors="pt", **tokenizer_kwargs)

    def _forward(self, model_inputs):
        if "use_cache" in inspect.signature(self.model.forward).parameters:
            model_inputs["use_cache"] = False
        return {"logits": self.model(**model_inputs).logits}

    def _default_function(self) -> ClassificationFunction:
        config = self.model.config
        if config.problem_type == "regression":
            return ClassificationFunction.NONE
        if config.problem_type == "multi_label_classification" or config.num_labels == 1:
            return ClassificationFunction.SIGMOID
        if config.problem_type == "single_label_classification" or config.num_labels > 1:
            return ClassificationFunction.SOFTMAX
        return getattr(config, "function_to_apply", ClassificationFunction.NONE)

    def postprocess(self, model_outputs, function_to_apply=None, top_k=1, _legacy=True):
        function_to_apply = function_to_apply if function_to_apply is not None else self._default_function()
        outputs = model_outputs["logits"][0].float().numpy()
        if function_to_apply == ClassificationFunction.SIGMOID:
            scores = sigmoid(outputs)
        elif function_to_apply == ClassificationFunction.SOFTMAX:
            scores = softmax(outputs)
        elif function_to_apply == ClassificationFunction.NONE:
            scores = outputs
        else:
            raise ValueError(f"Unrecognized `function_to_apply` argument: {function_to_apply}")
        id2label = self.model.config.id2label
        if top_k == 1 and _legacy:
            return {"label": id2label[scores.argmax().item()], "score": scores.max().item()}
        records = [{"label": id2label[i], "score": score.item()} for i, score in enumerate(scores)]
        if not _legacy:
            records.sort(key=lambda x: x["score"], reverse=True)
            records = records if top_k is None else records[:top_k]
        return records
