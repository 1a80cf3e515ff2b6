"""TextStreamer / TextIteratorStreamer receive what generate produces, and stop strings end generation."""

import threading

import hf_lite
import pytest
import torch
from hf_lite import GPT2Tokenizer, TextIteratorStreamer, TextStreamer
from hf_lite_testing import make_model

transformers = pytest.importorskip("transformers")


def _model_and_tokenizer(trained_tokenizer_dir):
    tok = GPT2Tokenizer.from_pretrained(trained_tokenizer_dir, eos_token="<|endoftext|>")
    model = make_model("gpt2", vocab_size=len(tok), eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    return model, tok


def test_text_streamer_prints_the_generated_text(trained_tokenizer_dir, capsys):
    model, tok = _model_and_tokenizer(trained_tokenizer_dir)
    prompt = tok("def main():\n    return", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=15, streamer=TextStreamer(tok, skip_prompt=True), eos_token_id=None)
    printed = capsys.readouterr().out
    assert printed == tok.decode(out[0, prompt["input_ids"].shape[1] :]) + "\n"
    assert len(printed.strip()) > 0


def test_text_iterator_streamer_from_another_thread(trained_tokenizer_dir):
    model, tok = _model_and_tokenizer(trained_tokenizer_dir)
    prompt = tok("import os\n", return_tensors="pt")
    streamer = TextIteratorStreamer(tok, timeout=60)
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(
            out=model.generate(**prompt, max_new_tokens=12, streamer=streamer, eos_token_id=None)
        )
    )
    thread.start()
    chunks = list(streamer)
    thread.join()
    assert "".join(chunks) == tok.decode(result["out"][0])
    assert len(chunks) >= 2, "sanity: text arrives in several pieces"


def test_stop_strings_end_generation(trained_tokenizer_dir):
    model, tok = _model_and_tokenizer(trained_tokenizer_dir)
    prompt = tok("class A:\n", return_tensors="pt")
    n = prompt["input_ids"].shape[1]
    free = model.generate(**prompt, max_new_tokens=20, eos_token_id=None)
    stop = tok.decode(free[0, n + 4 : n + 6])  # text of the 5th and 6th new tokens
    assert stop.strip(), "sanity: a non-empty stop string"
    out = model.generate(**prompt, max_new_tokens=20, eos_token_id=None, stop_strings=[stop], tokenizer=tok)
    text = tok.decode(out[0, n:])
    assert stop in text and out.shape[1] < free.shape[1]
    assert torch.equal(out[0], free[0, : out.shape[1]])


def test_streamer_and_stop_strings_survive_ids_past_the_tokenizer(trained_tokenizer_dir, capsys):
    """A model vocabulary padded past len(tokenizer) may generate ids the tokenizer does not know."""
    from hf_lite.generation import LogitsProcessor, LogitsProcessorList

    tok = GPT2Tokenizer.from_pretrained(trained_tokenizer_dir, eos_token="<|endoftext|>")
    model = make_model("gpt2", vocab_size=len(tok) + 16, eos_token_id=tok.eos_token_id)

    class ForcePaddedIds(LogitsProcessor):
        def __call__(self, input_ids, scores):
            if input_ids.shape[1] % 2:  # every other step picks an id only the model's vocabulary has
                scores = scores.clone()
                scores[:, len(tok) + 3] = 1e4
            return scores

    prompt = tok("def f():", return_tensors="pt")
    out = model.generate(
        **prompt,
        max_new_tokens=8,
        eos_token_id=None,
        logits_processor=LogitsProcessorList([ForcePaddedIds()]),
        streamer=TextStreamer(tok),
        stop_strings=["never appears"],
        tokenizer=tok,
    )
    assert (out >= len(tok)).sum() >= 3, "sanity: padded ids were generated"
    assert capsys.readouterr().out == tok.decode(out[0]) + "\n"


@pytest.mark.parametrize("kind", ["TextIteratorStreamer", "AsyncTextIteratorStreamer"])
def test_streamers_yield_the_chunks_transformers_yields(tmp_path, trained_tokenizer_dir, kind):
    """transformers 5's chunking: whole words and CJK characters at once, the rest up to the last space, the
    newline's token kept; an empty chunk for every step that finalises nothing, and at the end."""
    import asyncio
    import threading

    ours_model = make_model("gpt2", vocab_size=800)
    ours_model.save_pretrained(tmp_path)
    theirs_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)

    def run(lib, model, streamer, prompt):
        torch.manual_seed(3)
        kwargs = dict(**prompt, max_new_tokens=40, streamer=streamer, do_sample=True, top_k=0, pad_token_id=0)
        thread = threading.Thread(target=model.generate, kwargs=kwargs)
        thread.start()
        return thread

    async def pieces_async(lib, model, tok, prompt):
        streamer = lib.AsyncTextIteratorStreamer(tok, skip_prompt=True, timeout=60)
        thread = run(lib, model, streamer, prompt)
        pieces = [piece async for piece in streamer]
        thread.join()
        return pieces

    results = []
    for lib, model in ((hf_lite, ours_model), (transformers, theirs_model)):
        tok = lib.AutoTokenizer.from_pretrained(trained_tokenizer_dir)
        prompt = tok("def main():\n    return", return_tensors="pt")
        if kind == "AsyncTextIteratorStreamer":
            results.append(asyncio.run(pieces_async(lib, model, tok, prompt)))
        else:
            streamer = lib.TextIteratorStreamer(tok, skip_prompt=True, timeout=60)
            thread = run(lib, model, streamer, prompt)
            results.append(list(streamer))
            thread.join()
    ours, theirs = results
    assert ours == theirs and len("".join(ours).strip()) > 10
