"""GenerationMixin.generate: greedy and multinomial decoding over a KV cache (transformers' ``generation/utils.py``).

Flow as in transformers: merge kwargs into a copy of the model's GenerationConfig, settle special tokens (pad
defaults to the first EOS), infer the attention mask and position ids (left padding -> positions count real tokens
only), fix ``max_length``, build the logits processors and stopping criteria, then run one decoding loop. Each step
after the prefill feeds a single token and the cache supplies the past.
"""

from __future__ import annotations

import copy
import logging

import torch

from ..cache_utils import DynamicCache
from .beam_search import beam_search
from .configuration_utils import GenerationConfig
from .logits_process import (
    InfNanRemoveLogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from .outputs import GenerateBeamDecoderOnlyOutput, GenerateDecoderOnlyOutput  # noqa: F401  (re-exported)
from .stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)

logger = logging.getLogger(__name__)


def _merge(default_list, custom_list):
    """A user-supplied processor/criterion replaces the default of the same type, else is appended (transformers)."""
    if not custom_list:
        return default_list
    merged = type(default_list)()
    for item in default_list:
        custom = next((c for c in custom_list if type(c) is type(item)), None)
        merged.append(custom if custom is not None else item)
    merged.extend(c for c in custom_list if c not in merged)
    return merged


class GenerationMixin:
    """Mixed into causal-LM models; relies on ``forward(input_ids, attention_mask, position_ids, past_key_values,
    use_cache, logits_to_keep)`` returning ``.logits`` and ``.past_key_values``."""

    # ------------------------------------------------------------------ setup
    def _prepare_special_tokens(self, gc: GenerationConfig, device) -> None:
        eos = gc.eos_token_id
        eos = [eos] if isinstance(eos, int) else (list(eos) if eos is not None else None)
        if eos is not None and any(not isinstance(e, int) or isinstance(e, bool) for e in eos):
            raise TypeError(f"`eos_token_id` must be an int or a list of ints, got {gc.eos_token_id!r}")
        if eos and any(e < 0 for e in eos):
            # transformers only warns: a negative id never matches, so generation runs to max_length.
            logger.warning(
                "`eos_token_id` should consist of positive integers, but is %s. Your generation will not stop "
                "until the maximum length is reached.",
                eos,
            )
        gc._eos_token_tensor = torch.tensor(eos, device=device) if eos else None
        pad = eos[0] if gc.pad_token_id is None and eos else gc.pad_token_id  # pad defaults to the first EOS
        gc._pad_token_tensor = torch.tensor(pad, device=device) if pad is not None else None

    def _maybe_initialize_input_ids_for_generation(self, gc: GenerationConfig, model_kwargs: dict) -> torch.Tensor:
        """No prompt: start every row from BOS; the batch size comes from any tensor kwarg (transformers)."""
        if gc.bos_token_id is None:
            raise ValueError("`bos_token_id` has to be defined when no `input_ids` are provided.")
        batch = next((v.shape[0] for v in model_kwargs.values() if isinstance(v, torch.Tensor)), 1)
        return torch.full((batch, 1), gc.bos_token_id, dtype=torch.long, device=self.device)

    def _warn_if_right_padded(self, input_ids, attention_mask, gc) -> None:
        """Batched decoder-only generation continues each row from its last position: padding belongs on the left.
        The mask shows right padding (a 0 in the last column); without one, a pad id there (transformers' check)."""
        if getattr(self.config, "is_encoder_decoder", False) or gc._pad_token_tensor is None or input_ids.shape[0] < 2:
            return
        with_mask = attention_mask is not None and attention_mask.shape == input_ids.shape
        if bool((attention_mask[:, -1] == 0 if with_mask else input_ids[:, -1] == gc._pad_token_tensor).any()):
            logger.warning("A decoder-only architecture is being used, but right-padding was detected! For correct "
                           "generation results, please set `padding_side='left'` when initializing the tokenizer.")

    @staticmethod
    def _prepare_attention_mask_for_generation(input_ids: torch.Tensor, gc: GenerationConfig) -> torch.Tensor:
        pad, eos = gc._pad_token_tensor, gc._eos_token_tensor
        can_infer = pad is not None and bool(torch.isin(pad, input_ids).any())
        can_infer = can_infer and (eos is None or not bool(torch.isin(pad, eos).any()))
        return input_ids.ne(pad).long() if can_infer else torch.ones_like(input_ids, dtype=torch.long)

    def _get_logits_processor(self, gc, input_len: int, attention_mask, custom, device) -> LogitsProcessorList:
        processors = LogitsProcessorList()
        eos = gc._eos_token_tensor
        if gc.repetition_penalty is not None and gc.repetition_penalty != 1.0:
            padding_lengths = (attention_mask != 0).int().argmax(dim=1) if attention_mask is not None else None
            processors.append(RepetitionPenaltyLogitsProcessor(gc.repetition_penalty, padding_lengths))
        if gc.no_repeat_ngram_size is not None and gc.no_repeat_ngram_size > 0:
            processors.append(NoRepeatNGramLogitsProcessor(gc.no_repeat_ngram_size))
        if gc.bad_words_ids is not None:
            processors.append(NoBadWordsLogitsProcessor(gc.bad_words_ids, eos))
        if gc.min_length is not None and eos is not None and gc.min_length > 0:
            processors.append(MinLengthLogitsProcessor(gc.min_length, eos, device=device))
        if gc.min_new_tokens is not None and eos is not None and gc.min_new_tokens > 0:
            processors.append(MinNewTokensLengthLogitsProcessor(input_len, gc.min_new_tokens, eos, device=device))
        if gc.remove_invalid_values:
            processors.append(InfNanRemoveLogitsProcessor())
        if gc.suppress_tokens is not None:
            processors.append(SuppressTokensLogitsProcessor(gc.suppress_tokens, device=device))
        processors = _merge(processors, custom)
        if gc.do_sample:
            # Beam sampling must keep one non-EOS candidate per EOS id so beams can continue.
            keep = (eos.shape[0] + 1 if eos is not None else 2) if gc.num_beams > 1 else 1
            if gc.temperature is not None and gc.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(gc.temperature))
            if gc.top_k is not None and gc.top_k != 0:
                processors.append(TopKLogitsWarper(gc.top_k, min_tokens_to_keep=keep))
            if gc.top_p is not None and gc.top_p < 1.0:
                processors.append(TopPLogitsWarper(gc.top_p, min_tokens_to_keep=keep))
            if gc.min_p is not None:
                processors.append(MinPLogitsWarper(gc.min_p, min_tokens_to_keep=keep))
        return processors

    def _get_stopping_criteria(self, gc, custom, tokenizer) -> StoppingCriteriaList:
        criteria = StoppingCriteriaList()
        if gc.max_length is not None:
            criteria.append(MaxLengthCriteria(gc.max_length, getattr(self.config, "max_position_embeddings", None)))
        if gc.max_time is not None:
            criteria.append(MaxTimeCriteria(gc.max_time))
        if gc.stop_strings is not None:
            if tokenizer is None:
                raise ValueError(
                    "There are one or more stop strings, but no tokenizer: pass `tokenizer=` to `generate` "
                    "when generating with stop strings."
                )
            criteria.append(StopStringCriteria(tokenizer, gc.stop_strings))
        if gc._eos_token_tensor is not None:
            criteria.append(EosTokenCriteria(gc._eos_token_tensor))
        return _merge(criteria, custom)

    # ------------------------------------------------------------------ entry point
    @torch.no_grad()
    def generate(self, inputs: torch.LongTensor | None = None, generation_config: GenerationConfig | None = None,
                 logits_processor: LogitsProcessorList | None = None,
                 stopping_criteria: StoppingCriteriaList | None = None, streamer=None, tokenizer=None, **kwargs):
        base = generation_config if generation_config is not None else self.generation_config
        gc = copy.deepcopy(base if base is not None else GenerationConfig())
        has_default_max_length = kwargs.get("max_length") is None and gc.max_length == 20 and gc.max_new_tokens is None
        model_kwargs = gc.update(**kwargs)
        input_ids = inputs if inputs is not None else model_kwargs.pop("input_ids", None)
        if input_ids is None:
            input_ids = self._maybe_initialize_input_ids_for_generation(gc, model_kwargs)
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError("generate needs `input_ids` as a 2D LongTensor (batch, sequence)")
        attention_mask = model_kwargs.pop("attention_mask", None)
        user_position_ids = model_kwargs.pop("position_ids", None)
        if model_kwargs:
            raise ValueError(f"The following `model_kwargs` are not used by the model: {sorted(model_kwargs)}")
        device = input_ids.device
        self._prepare_special_tokens(gc, device)
        self._warn_if_right_padded(input_ids, attention_mask, gc)
        if attention_mask is None:
            attention_mask = self._prepare_attention_mask_for_generation(input_ids, gc)
        input_len = input_ids.shape[1]
        if gc.max_new_tokens is not None:
            gc.max_length = gc.max_new_tokens + input_len
        elif has_default_max_length:
            gc.max_length = gc.max_length + input_len
            max_pos = getattr(self.config, "max_position_embeddings", None)
            if max_pos is not None:
                gc.max_length = min(gc.max_length, max_pos)
        if gc.min_new_tokens is not None:
            gc.min_length = gc.min_new_tokens + input_len
        if input_len >= gc.max_length:
            logger.warning("Input length is %d, but `max_length` is set to %d", input_len, gc.max_length)
        if user_position_ids is not None:
            position_ids = user_position_ids.expand_as(input_ids)
        else:  # left padding: positions count real tokens only (transformers' _prepare_position_ids_for_generation)
            position_ids = attention_mask.long().cumsum(-1) - 1
            position_ids = position_ids.masked_fill(attention_mask == 0, 0)

        if streamer is not None and gc.num_beams > 1:
            raise ValueError("`streamer` cannot be used with beam search: set `num_beams=1` to stream.")
        # Expand before the processors are built: per-row state (the repetition penalty's padding lengths) must
        # have one row per beam / returned sequence, as in transformers.
        expand = max(gc.num_beams, gc.num_return_sequences)
        if expand > 1:
            input_ids, attention_mask, position_ids = (t.repeat_interleave(expand, dim=0)
                                                       for t in (input_ids, attention_mask, position_ids))
        processors = self._get_logits_processor(gc, input_len, attention_mask, logits_processor, device)
        criteria = self._get_stopping_criteria(gc, stopping_criteria, tokenizer)
        if gc.num_beams > 1:
            return beam_search(self, input_ids, attention_mask, position_ids, processors, criteria, gc)
        return self._sample(input_ids, attention_mask, position_ids, processors, criteria, gc, streamer)

    # ------------------------------------------------------------------ greedy / sampling
    def _sample(self, input_ids, attention_mask, position_ids, processors, criteria, gc, streamer):
        pad = gc._pad_token_tensor
        has_eos_criteria = any(isinstance(c, EosTokenCriteria) for c in criteria)
        if has_eos_criteria and pad is None:
            raise ValueError("`pad_token_id` must be set to fill finished sequences when stopping on EOS")
        batch = input_ids.shape[0]
        unfinished = torch.ones(batch, dtype=torch.long, device=input_ids.device)
        cache = DynamicCache() if gc.use_cache else None
        scores = () if gc.return_dict_in_generate and gc.output_scores else None
        if streamer is not None:
            streamer.put(input_ids.cpu())
        step_ids, step_pos = input_ids, position_ids
        while True:
            out = self(input_ids=step_ids, attention_mask=attention_mask, position_ids=step_pos, past_key_values=cache,
                       use_cache=gc.use_cache, logits_to_keep=1, return_dict=True)
            logits = out.logits[:, -1].to(dtype=torch.float32, copy=True)
            next_scores = processors(input_ids, logits)
            if scores is not None:
                scores += (next_scores,)
            if gc.do_sample:
                next_tokens = torch.multinomial(torch.softmax(next_scores, dim=-1), num_samples=1).squeeze(1)
            else:
                next_tokens = torch.argmax(next_scores, dim=-1)
            if has_eos_criteria:
                next_tokens = next_tokens * unfinished + pad * (1 - unfinished)
            input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
            if streamer is not None:
                streamer.put(next_tokens.cpu())
            unfinished = unfinished & ~criteria(input_ids, scores).long()
            if unfinished.max() == 0:
                break
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], dim=-1)
            next_pos = position_ids[:, -1:] + 1
            position_ids = torch.cat([position_ids, next_pos], dim=-1)
            if gc.use_cache:
                step_ids, step_pos, cache = next_tokens[:, None], next_pos, out.past_key_values
            else:
                step_ids, step_pos = input_ids, position_ids
        if streamer is not None:
            streamer.end()
        if gc.return_dict_in_generate:
            return GenerateDecoderOnlyOutput(sequences=input_ids, scores=scores, past_key_values=cache)
        return input_ids
