"""``TextGenerationPipeline``: prompts or chats in, ``generate``, text (or token ids) out (transformers'
``pipelines/text_generation.py``).

A string is tokenized (with an optional ``prefix``); a chat goes through the tokenizer's chat template, with a
generation prompt unless its last message is the assistant's (then that message is continued). ``_forward`` calls
``model.generate`` and groups the ``num_return_sequences`` rows of each prompt; ``postprocess`` decodes what follows
the prompt and returns it alone, after the prompt text, or as a new assistant message.
"""

from __future__ import annotations

import enum

import torch

from ...generation import GenerationConfig
from ...models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from .base import Chat, Pipeline


class ReturnType(enum.Enum):
    TENSORS = 0
    NEW_TEXT = 1
    FULL_TEXT = 2


class TextGenerationPipeline(Pipeline):
    """Language generation with a ``ForCausalLM`` model, for strings and chats (transformers' class).

    Unless the model's generation config sets them, generation uses ``max_new_tokens=256``, ``do_sample=True`` and
    ``temperature=0.7``, as in transformers.
    """

    _pipeline_calls_generate = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True
    _default_generation_config = GenerationConfig(max_new_tokens=256, do_sample=True, temperature=0.7)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.check_model_type(MODEL_FOR_CAUSAL_LM_MAPPING)
        if self.tokenizer is not None and self.tokenizer.padding_side == "right":
            self.tokenizer.padding_side = "left"  # batched decoder-only generation continues from the last column
        if "prefix" not in self._preprocess_params and self.prefix is not None:
            preprocess_params, forward_params, _ = self._sanitize_parameters(prefix=self.prefix, **self._forward_params)
            self._preprocess_params = {**self._preprocess_params, **preprocess_params}
            self._forward_params = {**self._forward_params, **forward_params}

    def _sanitize_parameters(self, return_full_text=None, return_tensors=None, return_text=None, return_type=None,
                             clean_up_tokenization_spaces=None, prefix=None, handle_long_generation=None,
                             stop_sequence=None, truncation=None, max_length=None, continue_final_message=None,
                             skip_special_tokens=None, tokenizer_encode_kwargs=None, tools=None, documents=None,
                             **generate_kwargs):
        preprocess_params = {}
        add_special_tokens = False
        if "add_special_tokens" in generate_kwargs:
            add_special_tokens = preprocess_params["add_special_tokens"] = generate_kwargs.pop("add_special_tokens")
        if "padding" in generate_kwargs:
            preprocess_params["padding"] = generate_kwargs.pop("padding")
        if truncation is not None:
            preprocess_params["truncation"] = truncation
        if max_length is not None:  # both a tokenizer and a generate argument, as in transformers
            preprocess_params["max_length"] = generate_kwargs["max_length"] = max_length
        for name, value in (("tools", tools), ("documents", documents), ("prefix", prefix),
                            ("continue_final_message", continue_final_message),
                            ("tokenizer_encode_kwargs", tokenizer_encode_kwargs)):
            if value is not None:
                preprocess_params[name] = value
        if prefix:
            prefix_ids = self.tokenizer(prefix, padding=False, add_special_tokens=add_special_tokens,
                                        return_tensors="pt")["input_ids"]
            generate_kwargs["prefix_length"] = prefix_ids.shape[-1]
        if handle_long_generation is not None:
            if handle_long_generation != "hole":
                raise ValueError(f"{handle_long_generation} is not a valid value for `handle_long_generation` "
                                 "parameter expected [None, 'hole']")
            preprocess_params["handle_long_generation"] = handle_long_generation
        preprocess_params.update(generate_kwargs)

        if stop_sequence is not None:
            generate_kwargs["stop_strings"] = [stop_sequence] if isinstance(stop_sequence, str) else stop_sequence
            generate_kwargs["tokenizer"] = self.tokenizer
        forward_params = generate_kwargs

        postprocess_params = {}
        if return_full_text is not None and return_type is None:
            if return_text is not None:
                raise ValueError("`return_text` is mutually exclusive with `return_full_text`")
            if return_tensors is not None:
                raise ValueError("`return_full_text` is mutually exclusive with `return_tensors`")
            return_type = ReturnType.FULL_TEXT if return_full_text else ReturnType.NEW_TEXT
        if return_tensors is not None and return_type is None:
            if return_text is not None:
                raise ValueError("`return_text` is mutually exclusive with `return_tensors`")
            return_type = ReturnType.TENSORS
        for name, value in (("return_type", return_type), ("tools", tools),
                            ("clean_up_tokenization_spaces", clean_up_tokenization_spaces),
                            ("continue_final_message", continue_final_message),
                            ("skip_special_tokens", skip_special_tokens)):
            if value is not None:
                postprocess_params[name] = value
        return preprocess_params, forward_params, postprocess_params

    def __call__(self, text_inputs, **kwargs):
        """Complete each prompt: a string, a list of strings, a chat (list of ``{"role", "content"}`` dicts) or a
        list of chats. Returns a list of ``{"generated_text": ...}`` (or ``{"generated_token_ids": ...}``) per
        input, ``num_return_sequences`` long."""
        return super().__call__(text_inputs, **kwargs)

    def preprocess(self, prompt_text, prefix="", handle_long_generation=None, add_special_tokens=None, truncation=None,
                   padding=None, max_length=None, continue_final_message=None, tokenizer_encode_kwargs=None,
                   tools=None, documents=None, **generate_kwargs):
        tokenizer_kwargs = {"add_special_tokens": add_special_tokens, "truncation": truncation, "padding": padding,
                            "max_length": max_length}
        tokenizer_kwargs = {key: value for key, value in tokenizer_kwargs.items() if value is not None}
        tokenizer_kwargs.update(tokenizer_encode_kwargs or {})
        if isinstance(prompt_text, Chat):
            tokenizer_kwargs.pop("add_special_tokens", None)  # the template writes its own special tokens
            if continue_final_message is None:  # a chat ending with the assistant is a prefill to continue
                continue_final_message = prompt_text.messages[-1]["role"] == "assistant"
            encoded = self.tokenizer.apply_chat_template(
                prompt_text.messages, add_generation_prompt=not continue_final_message,
                continue_final_message=continue_final_message, return_dict=True, return_tensors="pt", tools=tools,
                documents=documents, **tokenizer_kwargs)
        else:
            encoded = self.tokenizer(prefix + prompt_text, return_tensors="pt", **tokenizer_kwargs)
        inputs = {key: encoded[key] for key in ("input_ids", "attention_mask") if key in encoded}
        inputs["prompt_text"] = prompt_text
        if handle_long_generation == "hole":
            self._cut_for_hole(inputs, generate_kwargs)
        return inputs

    def _cut_for_hole(self, inputs: dict, generate_kwargs: dict) -> None:
        """Keep only the prompt's last tokens so that prompt + new tokens fit ``model_max_length``."""
        cur_len = inputs["input_ids"].shape[-1]
        params = self._get_set_generation_params(self._prepare_generate_kwargs(generate_kwargs))
        new_tokens = params.get("max_new_tokens")
        if new_tokens is None:
            new_tokens = params["max_length"] - cur_len
            if new_tokens < 0:
                raise ValueError("We cannot infer how many new tokens are expected")
        if cur_len + new_tokens > self.tokenizer.model_max_length:
            keep_length = self.tokenizer.model_max_length - new_tokens
            if keep_length <= 0:
                raise ValueError("We cannot use `hole` to handle this generation the number of desired tokens exceeds"
                                 " the models max length")
            for key in ("input_ids", "attention_mask"):
                if key in inputs:
                    inputs[key] = inputs[key][:, -keep_length:]

    def _forward(self, model_inputs, **generate_kwargs):
        input_ids = model_inputs["input_ids"]
        attention_mask = model_inputs.get("attention_mask")
        if input_ids.shape[1] == 0:  # an empty prompt: generate starts from BOS
            input_ids = attention_mask = None
            in_b = 1
        else:
            in_b = input_ids.shape[0]
        prompt_text = model_inputs.pop("prompt_text")
        prefix_length = generate_kwargs.pop("prefix_length", 0)
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        if prefix_length:  # a total length has to count the prefix the user did not write
            params = self._get_set_generation_params(generate_kwargs)
            for length, new_tokens in (("max_length", "max_new_tokens"), ("min_length", "min_new_tokens")):
                if length in params and new_tokens not in params:
                    generate_kwargs[length] = params[length] + prefix_length
        output = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **generate_kwargs)
        other_outputs = {}
        if hasattr(output, "sequences"):
            sequences = output.sequences
            out_b = sequences.shape[0]
            for key in ("scores", "sequences_scores", "beam_indices"):
                value = getattr(output, key, None)
                if isinstance(value, tuple) and value and len(value[0]) == out_b:
                    value = torch.stack(value).swapaxes(0, 1)
                if isinstance(value, torch.Tensor) and value.shape[0] == out_b:
                    other_outputs[key] = value.reshape(in_b, out_b // in_b, *value.shape[1:])
        else:
            sequences = output
        out_b = sequences.shape[0]
        generated = sequences.reshape(in_b, out_b // in_b, *sequences.shape[1:])
        return {"generated_sequence": generated, "input_ids": input_ids, "prompt_text": prompt_text, **other_outputs}

    def postprocess(self, model_outputs, return_type=ReturnType.FULL_TEXT, clean_up_tokenization_spaces=None,
                    continue_final_message=None, skip_special_tokens=None, tools=None):
        sequences = model_outputs["generated_sequence"][0].numpy().tolist()
        input_ids, prompt_text = model_outputs["input_ids"], model_outputs["prompt_text"]
        split = {key: value[0].numpy().tolist() for key, value in model_outputs.items()
                 if key not in {"generated_sequence", "input_ids", "prompt_text"} and isinstance(value, torch.Tensor)}
        skip_special_tokens = True if skip_special_tokens is None else skip_special_tokens
        prompt_len = 0 if input_ids is None else input_ids.shape[-1]
        records = []
        for idx, sequence in enumerate(sequences):
            if return_type == ReturnType.TENSORS:
                records.append({"generated_token_ids": sequence})
                continue
            text = self.tokenizer.decode(sequence[prompt_len:], skip_special_tokens=skip_special_tokens,
                                         clean_up_tokenization_spaces=clean_up_tokenization_spaces)
            if return_type == ReturnType.FULL_TEXT:
                text = self._full_text(prompt_text, text, continue_final_message)
            records.append({"generated_text": text, **{key: values[idx] for key, values in split.items()}})
        return records

    @staticmethod
    def _full_text(prompt_text, new_text, continue_final_message):
        """The prompt with the new text: appended to a string, to a prefilled last message, or a new reply."""
        if isinstance(prompt_text, str):
            return prompt_text + new_text
        messages = list(prompt_text.messages)
        if continue_final_message is None:
            continue_final_message = messages[-1]["role"] == "assistant"
        if continue_final_message:
            last = messages[-1]
            return messages[:-1] + [{"role": last["role"], "content": last["content"] + new_text}]
        return messages + [{"role": "assistant", "content": new_text}]
