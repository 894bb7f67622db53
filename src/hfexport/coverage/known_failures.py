"""The known failures of the coverage matrix, the one table every test that expects a failure reads.

A key is `(architecture, backend, mode)`: an architecture of `hfexport.presets`, a backend of
`BACKENDS`, a mode of `MODES` (`export`: the whole model as one graph, `dynamic=True`;
`generate`: the generation components and greedy tokens; `generate-image`: an image-text model's
greedy tokens from its prompt's image; `generate-audio`: a speech or audio-text model's greedy
tokens from generated clips). `hfexport coverage` judges its cases
against it (a listed case that passes shows as XPASS), and the test suite turns the same entries
into strict xfails (the backend parity panel reads `export`, the generation runner `generate`).
"""

from __future__ import annotations

import dataclasses

__all__ = ["BACKENDS", "KNOWN_FAILURES", "MODES", "KnownFailure"]

#: the built-in formats (`config.BUILTIN_FORMATS`) in the coverage page's column order
BACKENDS = ("dynamo", "onnx", "openvino", "executorch")
MODES = ("export", "generate", "generate-image", "generate-audio")
#: the modes of a text model (the only ones `mamba` and `falcon_mamba` have cells in)
_TEXT_MODES = ("export", "generate")


@dataclasses.dataclass(frozen=True)
class KnownFailure:
    """A case that fails for a reason we know and do not (or cannot) fix in hfexport."""

    reason: str
    upstream: str | None = None  # the upstream bug, "owner/repo#N", where there is one


#: (architecture, backend, mode) -> why it fails. One table: a fixed bug shows up as "unexpected pass".
_QWEN2_VL_ONE_GRAPH = KnownFailure(
    "the whole model in one graph computes its M-RoPE positions with a Python loop over groups of "
    "token types (get_rope_index: itertools.groupby over input_token_type.tolist()), data-dependent "
    "under torch.export; export the generation components (`--generate`: the language model takes the "
    "positions as an input), or pass position_ids with the sample inputs")

_SEQUENCE_LOOP = KnownFailure(
    "Mamba's reference path (no CUDA kernels) scans the prompt with a Python loop over its tokens "
    "(MambaMixer.slow_forward), so a program traced on one prompt fixes its length; hfexport refuses it "
    "naming the axis (it used to return the program as if dynamic, and OpenVINO then returned logits of the "
    "sample's length for a longer prompt). The one-token decode exports with a dynamic batch; a one-graph or "
    "prefill export of one fixed prompt length: dynamic=False, or dynamic_shapes leaving the sequence static")

KNOWN_FAILURES: dict[tuple[str, str, str], KnownFailure] = {
    **{(arch, backend, mode): _SEQUENCE_LOOP
       for arch in ("mamba", "falcon_mamba") for backend in BACKENDS for mode in _TEXT_MODES},
    **{("qwen2_vl", backend, "export"): _QWEN2_VL_ONE_GRAPH for backend in BACKENDS},
    ("mamba2", "dynamo", "export"): KnownFailure(
        "a one-token prompt takes Mamba2's single-step path (Mamba2Mixer.torch_forward branches on seq_len == 1 "
        "when it has a cache, and the one-graph forward builds one): the program, traced on a longer prompt, "
        "guards on more than one token. ONNX Runtime and ExecuTorch run the prompt path on one token and match "
        "eager; the generation components (what Mamba2 is exported for) take any prompt",
        "transformers 5.24 models/mamba2/modeling_mamba2.py Mamba2Mixer.torch_forward (seq_len == 1 branch)"),
    **{("mamba2", "openvino", mode): KnownFailure(
        "the chunked scan pads the sequence to a multiple of chunk_size with SymInt arithmetic; OpenVINO's "
        "PyTorch frontend has no conversion rule for operator.mod / torch.sym_min on symbolic sizes",
        "OpenVINO 2026.4.1 PyTorch FE (torch.export path)") for mode in _TEXT_MODES},
    **{("llava", backend, "export"): KnownFailure(
        "the whole model in one graph: the vision tower's batch, traced at 1, comes out bounded to 1..2 (a "
        "reshape guarded on the batch being 1), refused since it used to come back as if dynamic; and the "
        "prompt's image-token count is tied to the image, so no generic resize makes valid inputs. The "
        "generation components (what LLaVA is exported for) export and match",
        "torch 2.13 (reshape view-or-copy guard under backed_size_oblivious)") for backend in ("dynamo", "onnx", "openvino")},
    ("llava", "executorch", "export"): KnownFailure(
        "transformers' torch_compilable_check on the image-token count traces to aten._is_all_true, which is "
        "not in ExecuTorch's Core ATen opset; the generation components (what LLaVA is exported for) lower, "
        "and TRANSFORMERS_DISABLE_TORCH_CHECK=1 drops the check for a one-graph export"),
    ("swin", "openvino", "export"): KnownFailure(
        "window partitioning pads to a multiple of the window size with SymInt arithmetic; OpenVINO's "
        "PyTorch frontend has no conversion rule for operator.mod / torch.sym_min on symbolic sizes",
        "OpenVINO 2026.4.1 PyTorch FE (torch.export path)"),
    **{("swin", backend, "export"): KnownFailure(
        "Swin's layers are shaped by the stage resolutions (window padding and crop, odd-side padding in patch "
        "merging, the window clamp): branches decided at the sample's patch grid, so the program takes images "
        "whose patch grid (ceil(side / 4)) is the sample's. Other grids fail loudly (a torch.export guard; a "
        "Reshape error in ONNX Runtime). hfexport's patch embedding padding (models/swin.py) removed the silent "
        "case: a 34 x 34 image used to run in ONNX Runtime on the sample's 8 x 8 grid with wrong logits. Its "
        "batch, traced at 1, comes out bounded to 1..2 (torch.export guards a reshape of the windows on the batch "
        "being 1; traced at 2 the program refuses batch 1), refused unless allow_size_one_specialization=True")
        for backend in ("dynamo", "onnx", "executorch")},
    ("qwen2_audio", "dynamo", "export"): KnownFailure(
        "the whole model in one graph: Qwen2-Audio's forward merges the clip's rows only when the prompt is longer "
        "than one token (input_ids.shape[1] != 1), so the program is the merge branch and guards on it: the "
        "program refuses the validation's one-token smallest case (ONNX Runtime runs it and matches eager). The "
        "generation components (`--generate`, what an audio-text LLM is exported for) export and match",
        "transformers 5.24 models/qwen2_audio/modeling_qwen2_audio.py Qwen2AudioModel.forward"),
}
