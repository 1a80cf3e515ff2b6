# miniframes: vLLM's examples/offline_inference/basic/utils.py at commit 21034aef181d466f394cc3c2c4e8d71c07d8036c
# upstream sha256: 41a9dc770b04c69bc3b8e6846517aac1bac3622abddbd778e9b360f5e0d6c078
# run: imported by chat.py
# changed against upstream (nothing else):
#   - from vllm import SamplingParams
#   + from paged_serve import SamplingParams
#   - from vllm.utils import FlexibleArgumentParser
#   + from paged_serve.utils import FlexibleArgumentParser
# end of miniframes header
# SPDX-License-Identifier: Apache-2.0
from argparse import Namespace

from paged_serve import SamplingParams
from paged_serve.utils import FlexibleArgumentParser


def add_sampling_params_args(
        parser: FlexibleArgumentParser) -> FlexibleArgumentParser:
    sampling_params = SamplingParams()
    parser.add_argument("--max-tokens",
                        type=int,
                        default=sampling_params.max_tokens)
    parser.add_argument("--temperature",
                        type=float,
                        default=sampling_params.temperature)
    parser.add_argument("--top-p", type=float, default=sampling_params.top_p)
    parser.add_argument("--top-k", type=int, default=sampling_params.top_k)
    return parser


def del_sampling_params_args(args: Namespace) -> Namespace:
    del args.max_tokens
    del args.temperature
    del args.top_p
    del args.top_k
    return args
