"""The seed's ONNX Runtime decode loop: cache inputs/outputs paired as `input.<name>`/`output.<name>`.

Export first:

    hfexport export tiny:llama --generate --multi-token-decode --static-cache 64 --format onnx -o out/llama-onnx

then (or pass `--export tiny:llama` instead of the path: the loop exports it first):

    python examples/decode_loop_onnxruntime.py out/llama-onnx/decode.onnx --max-cache-len 64

An export with a prefill graph of its own (`export_for_generation` without multi-token decode)
runs the prompt through it: `... decode.onnx --prefill prefill.onnx --max-cache-len N`.

With a GPU and onnxruntime-gpu, the seed's loop runs as written: `CudaSession.set_buffer_sharing`
binds each `input.<name>`/`output.<name>` pair to one device buffer, so the cache is updated in
place. Without one, the CPU variant runs the same graph and feeds each `output.<name>` back as
the next `input.<name>`. Cache buffers are sized from the graph's own input metadata: every
symbolic cache axis is the cache length (a static cache's batch is fixed).

The mask is the one the graph declares: the seed's boolean causal mask `[1, 1, q, cache_len]`,
or, where the export's attention is ONNX Runtime's GroupQueryAttention (the default for a model
whose mask is the plain causal one), onnxruntime-genai's 2-D `[1, past + q]` of ones.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import onnxruntime as ort
import torch

_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
          "tensor(bool)": np.bool_, "tensor(int32)": np.int32}


def causal_mask(positions: torch.Tensor, cache_len: int) -> torch.Tensor:
    return (torch.arange(cache_len, device=positions.device)[None, :] <= positions[:, None])[None, None]


def takes_2d_mask(session: ort.InferenceSession) -> bool:
    """Whether the graph's `attention_mask` is GroupQueryAttention's 2-D one (past + new tokens)."""
    return next(len(i.shape) for i in session.get_inputs() if i.name == "attention_mask") == 2


def mask_for(positions: torch.Tensor, cache_len: int, two_d: bool) -> torch.Tensor:
    """The mask of a call whose new tokens sit at `positions` (the last is the newest)."""
    if two_d:
        return torch.ones((1, int(positions[-1]) + 1), dtype=torch.long, device=positions.device)
    return causal_mask(positions, cache_len)


def generate_cuda(path: str, prompt: list[int], max_new_tokens: int, max_cache_len: int) -> list[int]:
    """The seed's loop, unchanged: io-binding on CUDA, the cache updated in place."""
    from onnxruntime.transformers.io_binding_helper import CudaSession, TypeHelper

    session = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
    cuda = CudaSession(session, torch.device("cuda"))
    cache = {}
    for i in session.get_inputs():
        if not i.name.startswith("input."):
            continue
        name = i.name[len("input."):]
        dims = [max_cache_len if isinstance(d, str) and not d.isdigit() else int(d) for d in i.shape]
        cache[name] = torch.zeros(dims, dtype=TypeHelper.ort_type_to_torch_type(i.type), device="cuda")
        cuda.set_buffer_sharing(f"input.{name}", f"output.{name}")
    cache_feed = {f"input.{name}": buf for name, buf in cache.items()}
    vocab_size = next(o.shape[-1] for o in session.get_outputs() if o.name.endswith("logits"))

    two_d = takes_2d_mask(session)
    prompt_ids = torch.tensor([prompt], device="cuda")
    prompt_len = prompt_ids.shape[1]
    positions = torch.arange(prompt_len, device="cuda")
    cuda.allocate_buffers({"logits": (1, prompt_len, vocab_size)})
    out = cuda.infer({"input_ids": prompt_ids, "attention_mask": mask_for(positions, max_cache_len, two_d),
                      "position_ids": positions[None], **cache_feed})
    next_token = out["logits"][:, -1:].argmax(-1)
    tokens = [int(next_token)]

    cuda.allocate_buffers({"logits": (1, 1, vocab_size)})
    input_ids = torch.empty((1, 1), dtype=torch.long, device="cuda")
    position_ids = torch.empty((1, 1), dtype=torch.long, device="cuda")
    attention_mask = torch.empty((1, 1, 1, max_cache_len), dtype=torch.bool, device="cuda")
    slots = torch.arange(max_cache_len, device="cuda")
    for position in range(prompt_len, min(prompt_len + max_new_tokens - 1, max_cache_len)):
        input_ids.copy_(next_token)
        position_ids.fill_(position)
        attention_mask[0, 0, 0].copy_(slots <= position)
        mask = torch.ones((1, position + 1), dtype=torch.long, device="cuda") if two_d else attention_mask
        out = cuda.infer({"input_ids": input_ids, "attention_mask": mask,
                          "position_ids": position_ids, **cache_feed})
        next_token = out["logits"][:, -1:].argmax(-1)
        tokens.append(int(next_token))
    return tokens


def generate_cpu(path: str, prompt: list[int], max_new_tokens: int, max_cache_len: int,
                 prefill: str | None = None) -> list[int]:
    """The same loop on the CPU: each `output.<name>` becomes the next call's `input.<name>`.
    `prefill`: the `prefill.onnx` of an export without multi-token decode, which takes the prompt
    (same inputs and outputs as the decode graph); the decode graph then takes one token a call."""
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    first = ort.InferenceSession(prefill, providers=["CPUExecutionProvider"]) if prefill else session
    cache = {}
    for i in session.get_inputs():
        if not i.name.startswith("input."):
            continue
        dims = [max_cache_len if isinstance(d, str) and not d.isdigit() else int(d) for d in i.shape]
        cache[i.name[len("input."):]] = np.zeros(dims, dtype=_NUMPY[i.type])
    output_names = [o.name for o in session.get_outputs()]
    two_d = takes_2d_mask(session)

    def step(input_ids: np.ndarray, positions: np.ndarray, graph: ort.InferenceSession = session) -> int:
        mask = mask_for(torch.from_numpy(positions), max_cache_len, two_d).numpy()
        feed = {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions[None],
                **{f"input.{name}": buf for name, buf in cache.items()}}
        out = dict(zip(output_names, graph.run(output_names, feed)))
        for name in cache:
            cache[name] = out[f"output.{name}"]
        return int(out["logits"][0, -1].argmax())

    prompt_len = len(prompt)
    tokens = [step(np.array([prompt], dtype=np.int64), np.arange(prompt_len), first)]
    for position in range(prompt_len, min(prompt_len + max_new_tokens - 1, max_cache_len)):
        tokens.append(step(np.array([[tokens[-1]]], dtype=np.int64), np.array([position])))
    return tokens


def generate(path: str, prompt: list[int], max_new_tokens: int, max_cache_len: int) -> list[int]:
    if torch.cuda.is_available() and "CUDAExecutionProvider" in ort.get_available_providers():
        return generate_cuda(path, prompt, max_new_tokens, max_cache_len)
    return generate_cpu(path, prompt, max_new_tokens, max_cache_len)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="decode.onnx written by `hfexport export --generate --static-cache N`")
    parser.add_argument("--export", metavar="MODEL", help="export MODEL first (`tiny:llama`, a folder) with the export job, "
                        "into a temporary folder, and run the loop on its decode graph")
    parser.add_argument("--max-cache-len", type=int, default=64, help="the N the export used (with --export: the one it uses)")
    parser.add_argument("--prefill", metavar="PREFILL_ONNX", help="the export's prefill.onnx, where it has one (an "
                        "export without --multi-token-decode): it takes the prompt, the decode graph the rest (CPU)")
    parser.add_argument("--prompt-ids", default="1,2,3,4")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()
    prompt = [int(t) for t in args.prompt_ids.split(",")]
    if args.model is None and args.export is None:
        parser.error("give the exported model or --export MODEL")
    if args.export is None:
        path = args.model
        if args.prefill:
            print(generate_cpu(path, prompt, args.max_new_tokens, args.max_cache_len, prefill=args.prefill))
        else:
            print(generate(path, prompt, args.max_new_tokens, args.max_cache_len))
        return
    from hfexport import AutoExportConfig
    from hfexport.job import GenerationOptions, export_to_folder

    with tempfile.TemporaryDirectory() as tmp:
        config = AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True})
        path = str(export_to_folder(args.export, config, f"{tmp}/export",
                                    generation=GenerationOptions(static_cache=args.max_cache_len)).files("decode")[0])
        print(generate(path, prompt, args.max_new_tokens, args.max_cache_len))


if __name__ == "__main__":
    main()
