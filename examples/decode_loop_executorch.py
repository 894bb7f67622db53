"""The seed's ExecuTorch decode loop, from Python: sizes from `method_meta`, the cache read back.

Export first (XNNPACK; the flags let the C++ runtime write the cache into the caller's buffers):

    hfexport export tiny:llama --generate --multi-token-decode --static-cache 64 --format executorch \
        --no-llm-runner -o out/llama-et

(`--no-llm-runner`: the static-cache components, the cache as method inputs, which this loop
drives; without it the folder holds the program ExecuTorch's own LLM runner loads, its cache inside.)

then (or pass `--export tiny:llama` instead of the path: the loop exports it first):

    python examples/decode_loop_executorch.py out/llama-et/decode.pte

The method's inputs are `[input_ids, attention_mask, position_ids, cache x N]` and its outputs
`[cache x N, logits, cache x N]`. ExecuTorch's Python runtime cannot bind outputs to the
caller's memory (`Method::set_output_data_ptr` is C++ only; see `decode_loop_executorch.cpp` for
the zero-copy loop), so here each call's last N outputs become the next call's cache inputs.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from executorch.runtime import Runtime

# ExecuTorch ScalarType codes (executorch/runtime/core/portable_type/scalar_type.h)
_DTYPES = {3: torch.int32, 4: torch.long, 5: torch.float16, 6: torch.float32, 11: torch.bool, 15: torch.bfloat16}


def generate(path: str, prompt: list[int], max_new_tokens: int) -> list[int]:
    method = Runtime.get().load_program(path).load_method("forward")
    meta = method.metadata
    num_cache = meta.num_inputs() - 3
    # one set of StaticCache buffers (K/V + per-layer write counters), shaped from method_meta
    cache = []
    for i in range(num_cache):
        info = meta.input_tensor_meta(3 + i)
        cache.append(torch.zeros(tuple(info.sizes()), dtype=_DTYPES[info.dtype()]))
    max_cache_len = next(c.shape[2] for c in cache if c.dim() == 4)

    def forward(input_ids: torch.Tensor, positions: torch.Tensor) -> int:
        mask = (torch.arange(max_cache_len)[None, :] <= positions[:, None])[None, None]
        outputs = method.execute([input_ids, mask, positions[None], *cache])
        cache[:] = outputs[num_cache + 1:]  # the mutated cache: the last N outputs
        return int(outputs[num_cache][0, -1].argmax())  # logits

    prompt_len = len(prompt)
    tokens = [forward(torch.tensor([prompt]), torch.arange(prompt_len))]  # prefill the whole prompt
    for position in range(prompt_len, min(prompt_len + max_new_tokens - 1, max_cache_len)):
        tokens.append(forward(torch.tensor([[tokens[-1]]]), torch.tensor([position])))
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program", nargs="?", help="decode.pte written by `hfexport export --generate --static-cache N`")
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
        config = AutoExportConfig.from_dict({"export_format": "executorch", "dynamic": True})
        path = str(export_to_folder(args.export, config, f"{tmp}/export",
                                    generation=GenerationOptions(static_cache=args.max_cache_len),
                                    llm_runner=False).files("decode")[0])
        print(generate(path, prompt, args.max_new_tokens))


if __name__ == "__main__":
    main()
