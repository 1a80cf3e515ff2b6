# miniframes: vLLM's examples/offline_inference/basic.py at commit 1772b79fdf3effcd91bf9728df97a7e104be8c31
# upstream sha256: dc52f5cb01ecce1bd0370646aef97a29895156b8a19a571293e5866f948bb7a7
# run: python basic.py  (in a directory holding the checkpoint as ./tiny-llama)
# changed against upstream (nothing else):
#   - from vllm import LLM, SamplingParams
#   + from paged_serve import LLM, SamplingParams
#   - llm = LLM(model="Qwen/Qwen2-7B", max_model_len=512, max_num_seqs=16)
#   + llm = LLM(model="tiny-llama", max_model_len=512, max_num_seqs=16)
# end of miniframes header
# SPDX-License-Identifier: Apache-2.0

from paged_serve import LLM, SamplingParams

# Sample prompts.
prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
# Create a sampling params object.
sampling_params = SamplingParams()  #temperature=0.8, top_p=0.95)

# Create an LLM.
llm = LLM(model="tiny-llama", max_model_len=512, max_num_seqs=16)

# Generate texts from the prompts. The output is a list of RequestOutput objects
# that contain the prompt, generated text, and other information.
outputs = llm.generate(prompts, sampling_params)
# Print the outputs.
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")
