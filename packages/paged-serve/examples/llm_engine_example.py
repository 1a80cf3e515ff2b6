# miniframes: vLLM's examples/offline_inference/llm_engine_example.py at commit 1628e182a28a5ac6f40672b74d7fd7171f97f3c4
# upstream sha256: 18c67f8b53f1713d5ee7b4b0e4fc0aaf8901dacc7ed565c774e016e0b0900d0f
# run: python llm_engine_example.py --model DIR [engine flags]
# changed against upstream (nothing else):
#   - from vllm import EngineArgs, LLMEngine, RequestOutput, SamplingParams
#   + from paged_serve import EngineArgs, LLMEngine, RequestOutput, SamplingParams
#   - from vllm.utils import FlexibleArgumentParser
#   + from paged_serve.utils import FlexibleArgumentParser
# end of miniframes header
import argparse
from typing import Tuple

from paged_serve import EngineArgs, LLMEngine, RequestOutput, SamplingParams
from paged_serve.utils import FlexibleArgumentParser


def create_test_prompts() -> list[Tuple[str, SamplingParams]]:
    """Create a list of test prompts with their sampling parameters."""
    return [
        ("A robot may not injure a human being",
         SamplingParams(temperature=0.0, logprobs=1, prompt_logprobs=1)),
        ("To be or not to be,",
         SamplingParams(temperature=0.8, top_k=5, presence_penalty=0.2)),
        ("What is the meaning of life?",
         SamplingParams(n=2,
                        best_of=5,
                        temperature=0.8,
                        top_p=0.95,
                        frequency_penalty=0.1)),
    ]


def process_requests(engine: LLMEngine,
                     test_prompts: list[Tuple[str, SamplingParams]]):
    """Continuously process a list of prompts and handle the outputs."""
    request_id = 0

    while test_prompts or engine.has_unfinished_requests():
        if test_prompts:
            prompt, sampling_params = test_prompts.pop(0)
            engine.add_request(str(request_id), prompt, sampling_params)
            request_id += 1

        request_outputs: list[RequestOutput] = engine.step()

        for request_output in request_outputs:
            if request_output.finished:
                print(request_output)


def initialize_engine(args: argparse.Namespace) -> LLMEngine:
    """Initialize the LLMEngine from the command line arguments."""
    engine_args = EngineArgs.from_cli_args(args)
    return LLMEngine.from_engine_args(engine_args)


def main(args: argparse.Namespace):
    """Main function that sets up and runs the prompt processing."""
    engine = initialize_engine(args)
    test_prompts = create_test_prompts()
    process_requests(engine, test_prompts)


if __name__ == '__main__':
    parser = FlexibleArgumentParser(
        description='Demo on using the LLMEngine class directly')
    parser = EngineArgs.add_cli_args(parser)
    args = parser.parse_args()
    main(args)
