"""The seed's Dynamo decode loop: one static-cache `decode` graph, the cache updated in place.

Export first (a tiny random Llama here; any causal LM folder works the same):

    hfexport export tiny:llama --generate --multi-token-decode --static-cache 64 -o out/llama-dynamo

then (or pass `--export tiny:llama` instead of the path: the loop exports it first):

    python examples/decode_loop_dynamo.py out/llama-dynamo/decode.pt2 --prompt-ids 1,2,3,4 --max-new-tokens 16

It runs on the device the program's cache template lives on (CUDA when exported on a GPU, CPU
otherwise): the loop is the seed's, with `"cuda"` replaced by that device.
"""

from __future__ import annotations

import argparse
import tempfile
import copy

import torch
from transformers import StaticCache

from hfexport.exporter_dynamo import register_pytree_node


def causal_mask(positions: torch.Tensor, cache_len: int) -> torch.Tensor:  # [1, 1, len(positions), cache_len]
    return (torch.arange(cache_len, device=positions.device)[None, :] <= positions[:, None])[None, None]


@torch.no_grad()
def generate(path: str, prompt: list[int], max_new_tokens: int) -> list[int]:
    register_pytree_node(StaticCache)
    exported = torch.export.load(path)
    decode = exported.module()

    # the artifact carries an initialized StaticCache template: reuse it, reset to empty
    _, example_kwargs = exported.example_inputs
    past_key_values = copy.deepcopy(example_kwargs["past_key_values"])
    past_key_values.reset()
    device = past_key_values.layers[0].keys.device
    max_cache_len = past_key_values.layers[0].keys.shape[2]
    prompt_ids = torch.tensor([prompt], device=device)
    prompt_len = prompt_ids.shape[1]

    # prefill: the whole prompt in one call
    positions = torch.arange(prompt_len, device=device)
    logits = decode(input_ids=prompt_ids, attention_mask=causal_mask(positions, max_cache_len),
                    position_ids=positions[None], past_key_values=past_key_values).logits
    next_token = logits[:, -1:].argmax(-1)
    tokens = [int(next_token)]

    # decode: query=1 buffers reused in place
    input_ids = torch.empty((1, 1), dtype=torch.long, device=device)
    position_ids = torch.empty((1, 1), dtype=torch.long, device=device)
    attention_mask = torch.empty((1, 1, 1, max_cache_len), dtype=torch.bool, device=device)
    slots = torch.arange(max_cache_len, device=device)
    for position in range(prompt_len, min(prompt_len + max_new_tokens - 1, max_cache_len)):
        input_ids.copy_(next_token)
        position_ids.fill_(position)
        attention_mask[0, 0, 0].copy_(slots <= position)
        logits = decode(input_ids=input_ids, attention_mask=attention_mask,
                        position_ids=position_ids, past_key_values=past_key_values).logits
        next_token = logits[:, -1:].argmax(-1)
        tokens.append(int(next_token))
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program", nargs="?", help="decode.pt2 written by `hfexport export --generate --static-cache N`")
    parser.add_argument("--export", metavar="MODEL", help="export MODEL first (`tiny:llama`, a folder) with the export job, "
                        "into a temporary folder, and run the loop on its decode graph")
    parser.add_argument("--prompt-ids", default="1,2,3,4")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--max-cache-len", type=int, default=64, help="with --export: the static cache's length")
    args = parser.parse_args()
    prompt = [int(t) for t in args.prompt_ids.split(",")]
    if args.program is None and args.export is None:
        parser.error("give the exported program or --export MODEL")
    if args.export is None:
        path = args.program
        print(generate(path, prompt, args.max_new_tokens))
        return
    from hfexport import AutoExportConfig
    from hfexport.job import GenerationOptions, export_to_folder

    with tempfile.TemporaryDirectory() as tmp:
        config = AutoExportConfig.from_dict({"export_format": "dynamo", "dynamic": True})
        path = str(export_to_folder(args.export, config, f"{tmp}/export",
                                    generation=GenerationOptions(static_cache=args.max_cache_len)).files("decode")[0])
        print(generate(path, prompt, args.max_new_tokens))


if __name__ == "__main__":
    main()
