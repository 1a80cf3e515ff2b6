# hf-lite drop-in >>>
# Upstream: huggingface/transformers docs/source/en/chat_templating.md, its chat-pipeline part as transformers 5's
#           pages show it (the page's current text and commit were not available here; the calls are its
#           section's: a chat with a system message through pipeline("text-generation"), the reply read as the last
#           message of `generated_text`, then the conversation continued with a new user message).
# Changes (tests/test_example_pipeline_docs.py runs this file and, with the imports swapped back, under transformers):
#   from transformers import pipeline -> from hf_lite import pipeline
#   The hub chat model (HuggingFaceH4/zephyr-7b-beta, loaded with dtype=torch.bfloat16, device_map="auto") is swapped
#   for a local checkpoint with a chat template (the first argument), in its saved dtype on one device; the replies
#   are 24 new tokens (the page: 512), seeded with torch.manual_seed(0), and printed as JSON.
# CUDA-only lines: none.
# hf-lite drop-in <<<
import json
import sys

import torch
from hf_lite import pipeline

torch.manual_seed(0)
pipe = pipeline("text-generation", model=sys.argv[1])
chat = [
    {"role": "system", "content": "You are a friendly chatbot who always responds in the style of a pirate"},
    {"role": "user", "content": "How many helicopters can a human eat in one sitting?"},
]
response = pipe(chat, max_new_tokens=24)
print(json.dumps(response[0]["generated_text"][-1]["content"]))

chat = response[0]["generated_text"]
chat.append({"role": "user", "content": "Wait, what's so wild about soup cans?"})
response = pipe(chat, max_new_tokens=24)
print(json.dumps(response[0]["generated_text"]))
