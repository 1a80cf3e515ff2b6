# miniframes: vLLM's examples/online_serving/openai_completion_client.py at commit 352da94dc7cfcbf8d2d0a5a860ab40910c98312c
# upstream sha256: 05c5e4b33000f4f990faefe8bd5303ad2fc69ff8f34b0bbbe7250bd5f8c0801d
# run: paged-serve serve DIR --port 8000, then python openai_completion_client.py
# changed against upstream: nothing (the openai client, pointed at paged-serve's server)
# end of miniframes header
# SPDX-License-Identifier: Apache-2.0

from openai import OpenAI

# Modify OpenAI's API key and API base to use vLLM's API server.
openai_api_key = "EMPTY"
openai_api_base = "http://localhost:8000/v1"

client = OpenAI(
    # defaults to os.environ.get("OPENAI_API_KEY")
    api_key=openai_api_key,
    base_url=openai_api_base,
)

models = client.models.list()
model = models.data[0].id

# Completion API
stream = True
completion = client.completions.create(
    model=model,
    prompt="A robot may not injure a human being",
    echo=False,
    # n=2,
    stream=stream,
)
# logprobs=3)

print("Completion results:")
if stream:
    for c in completion:
        print(c)
else:
    print(completion)
