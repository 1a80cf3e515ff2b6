# hf-lite drop-in >>>
# Upstream: huggingface/transformers docs/source/en/pipeline_tutorial.md
#           at commit 00e1f374604fd0f76e85079be78f41e05934021a: its text-generation code blocks, in its order.
# Changes (tests/test_example_pipeline_docs.py runs this file and, with the imports swapped back, under transformers):
#   from transformers import pipeline -> from hf_lite import pipeline (in each block, as the page imports per block)
#   The hub models (google/gemma-2-2b, openai-community/gpt2) are swapped for a local checkpoint of a family hf-lite
#   has (the first argument). Each block is a function printing its results; each starts from torch.manual_seed(0)
#   (the page samples unseeded). The generator block names task="text-generation" (the page infers the task from
#   the hub's model card) and yields 3 prompts (the page: 1000). The page's non-text-generation blocks (ASR, image
#   classification, VQA, zero-shot, the KeyDataset/imdb text-classification ones) and its bitsandbytes block are not
#   here: hf-lite has text generation only.
# CUDA-only lines: none (device=0 is the CPU where there is no GPU, as in transformers).
# hf-lite drop-in <<<
import json
import sys

import torch

MODEL = sys.argv[1]


def show(name, result):
    print(name, json.dumps(result))


def one_prompt():
    from hf_lite import pipeline

    pipeline = pipeline(task="text-generation", model=MODEL)
    show("one_prompt", pipeline("the secret to baking a really good cake is "))


def list_of_prompts():
    from accelerate import Accelerator
    from hf_lite import pipeline

    device = Accelerator().device
    pipeline = pipeline(task="text-generation", model=MODEL, device=device)
    show("list_of_prompts", pipeline(["the secret to baking a really good cake is ", "a baguette is "]))


def batch_inference():
    from accelerate import Accelerator
    from hf_lite import pipeline

    device = Accelerator().device
    pipeline = pipeline(task="text-generation", model=MODEL, device=device, batch_size=2)
    show("batch_inference",
         pipeline(["the secret to baking a really good cake is", "a baguette is", "paris is the", "hotdogs are"]))


def task_specific_parameters():
    from hf_lite import pipeline

    pipeline = pipeline(task="text-generation", model=MODEL)
    show("task_specific_parameters",
         pipeline("the secret to baking a good cake is", num_return_sequences=4, return_full_text=False))


def generator_input():
    from hf_lite import pipeline

    def data():
        for i in range(3):
            yield f"My example {i}"

    pipeline = pipeline(task="text-generation", model=MODEL, device=0)
    generated_characters = 0
    for out in pipeline(data()):
        generated_characters += len(out[0]["generated_text"])
    show("generator_input", generated_characters)


for block in (one_prompt, list_of_prompts, batch_inference, task_specific_parameters, generator_input):
    torch.manual_seed(0)
    block()
