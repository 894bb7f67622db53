"""The one harness every backend's parity tests use: build → export → run in runtime → compare;
and the tiers' helpers: skip without a backend's extra, xfail a known failure."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch

from hfexport import validate
from hfexport._versions import EXTRAS
from hfexport.coverage.known_failures import KNOWN_FAILURES
from hfexport.presets import build_preset


def require_backend(fmt: str) -> None:
    """Skip the calling test unless every package of `fmt`'s extra imports (`pytest.importorskip`)."""
    for package in EXTRAS[fmt]:
        pytest.importorskip(package)


def known_failure_marks(arch: str, backend: str, mode: str) -> list:
    """A strict xfail with the reason (and upstream bug) of `(arch, backend, mode)` in
    `hfexport.coverage.KNOWN_FAILURES`, or no mark when the case is not listed there."""
    known = KNOWN_FAILURES.get((arch, backend, mode))
    if known is None:
        return []
    reason = known.reason + (f" [{known.upstream}]" if known.upstream else "")
    return [pytest.mark.xfail(reason=reason, strict=True)]


def export_and_validate(exporter, config, name: str, inputs: dict[str, Any] | None = None, *,
                        exported: tuple[Any, dict[str, Any], Any] | None = None, **validate_kwargs):
    """Export preset `name` with `exporter`/`config`, validate it in its runtime, and return
    `(artifact, report, model, inputs)`; asserts every case of the report passed. `exported`:
    `(model, inputs, artifact)`, that same export already made (`dynamic_llama`), validated here."""
    if exported is not None:
        model, inputs, artifact = exported
        report = validate(artifact, model, inputs, **validate_kwargs)
        assert report.passed, report.to_table()
        return artifact, report, model, inputs
    model, sample = build_preset(name)
    inputs = sample if inputs is None else inputs
    artifact = exporter.export(model, inputs, config=config)
    report = validate(artifact, model, inputs, **validate_kwargs)
    assert report.passed, report.to_table()
    return artifact, report, model, inputs


def expected_cases(inputs: dict[str, Any], dynamic: bool, steps: tuple[int, ...] = (2,)) -> list[str]:
    """The case labels `validate` reports for a panel preset's sample: the sample, one resized case
    per step, and `smallest` when the sample has more than one token to shrink."""
    if not dynamic:
        return ["sample"]
    resized = ["resized"] if len(steps) == 1 else [f"resized+{step}" for step in steps]
    tokens = any(isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] > 1
                 for k, v in inputs.items() if k in ("input_ids", "decoder_input_ids"))
    return ["sample", *resized, *(["smallest"] if tokens else [])]


def assert_close_to_eager(got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = (got.double() - want.double()).abs().max().item()
    assert diff <= atol, f"max abs difference {diff} > {atol}"


def padded_batch(batch: int = 2, length: int = 8, pad: int = 3) -> dict[str, torch.Tensor]:
    """A left-padded batch for the tiny text presets, as a tokenizer pads a shorter prompt."""
    ids = torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    return {"input_ids": ids, "attention_mask": mask}


def seed_dynamic_shapes(batch_max: int = 32, seq_max: int = 2048) -> dict[str, Any]:
    """The seed's fine-grained `dynamic_shapes`: `Dim("batch")` and `Dim("seq")` on ids and mask."""
    batch = torch.export.Dim("batch", min=1, max=batch_max)
    seq = torch.export.Dim("seq", min=1, max=seq_max)
    return {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}


def onnx_graph(program, constant_names: bool = True) -> dict:
    """What an ONNX program (a `ModelProto`, or anything with `model_proto`) is, less its intermediate
    value names: ops in order with their attributes and wiring (an intermediate value numbered where it
    is first made), initializers' bytes by name, inputs and outputs with their types and dims. Without
    `constant_names`, an initializer that is no parameter (a folded constant, `val_12`) is named by
    where it is first read, as an intermediate value."""
    import onnx
    from onnx import numpy_helper

    proto = getattr(program, "model_proto", program)
    made: dict[str, str] = {}
    graph_outputs = {v.name for v in proto.graph.output}
    if not constant_names:
        parameters = {i.name for i in proto.graph.initializer
                      if any(p.key == "pkg.torch.export.graph_signature.InputSpec.kind" for p in i.metadata_props)}
        initializers = {i.name for i in proto.graph.initializer} - parameters
        for node in proto.graph.node:
            for name in node.input:
                if name in initializers and name not in made:
                    made[name] = f"#{len(made)}"

    def attribute(a):
        return numpy_helper.to_array(a.t).tobytes() if a.type == onnx.AttributeProto.TENSOR else \
            onnx.helper.get_attribute_value(a)

    def interface(values):
        return [(v.name, v.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
                for v in values]

    def wired(node):
        ins = [made.get(name, name) for name in node.input]
        outs = [made.setdefault(name, name if name in graph_outputs or not name else f"%{len(made)}")
                for name in node.output]
        return (node.domain, node.op_type, sorted((a.name, attribute(a)) for a in node.attribute), ins, outs)

    return {"ops": [wired(n) for n in proto.graph.node],
            "initializers": {made.get(i.name, i.name): numpy_helper.to_array(i).tobytes() for i in proto.graph.initializer},
            "inputs": interface(proto.graph.input), "outputs": interface(proto.graph.output),
            "opsets": sorted((o.domain, o.version) for o in proto.opset_import)}


@contextlib.contextmanager
def without(registry, name: str):
    """Take the workaround `name` out of `registry` for the block (to show it is needed); put it back."""
    entry = registry.remove(name)
    try:
        yield entry
    finally:
        registry.add(name, entry)


def tiny_decoder(model_type: str, layers: int = 2, *, head_dim: int = 8, kv_heads: int = 2, prompt: int = 5,
                 seed: int = 0, **overrides) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A tiny decoder-only LM of `model_type` from its config's defaults (random weights after
    `torch.manual_seed(seed)`; vocabulary 96, hidden 32, 4 heads, `layers` layers, `overrides` on
    top) and a `prompt`-token sample without padding (ids 3-95, drawn after the weights)."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(
        model_type, vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    inputs = {"input_ids": torch.randint(3, 96, (1, prompt)), "attention_mask": torch.ones(1, prompt, dtype=torch.long)}
    return model, inputs


def tiny_bpe_tokenizer():
    """A byte-level BPE tokenizer trained offline on a few sentences (ids 0 `<s>`, 1 `</s>`); its
    alphabet is printable ASCII, so every token decodes to text on its own (ExecuTorch's
    `TextLLMRunner` callback gets whole strings)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog", "hello world, this is a tiny tokenizer",
              "once upon a time there was a model"] * 20
    alphabet = [chr(b) for b in range(33, 127)] + ["\u0120"]  # byte-level's own character for a space
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                                              show_progress=False,
                                                              initial_alphabet=alphabet))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")


#: Run in a fresh process, as a user would: `GenerationRunner` on the folder, then ExecuTorch's own
#: `TextLLMRunner` on its `decode.pte` and `tokenizer.json` (the llama:: kernels imported first).
_BOTH_LLM_RUNNERS = """
import json, sys
from hfexport import GenerationRunner
folder, prompt, ids, new = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
ours = GenerationRunner.load(folder, engine="hfexport").generate(ids, max_new_tokens=new, min_new_tokens=new).tokens
from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 - registers the llama:: kernels
from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
pieces = []
runner = TextLLMRunner(folder + "/decode.pte", folder + "/tokenizer.json")
runner.generate(prompt, GenerationConfig(echo=False, max_new_tokens=new, temperature=0.0), token_callback=pieces.append)
print("RESULT " + json.dumps({"ours": ours, "pieces": pieces}))
"""


def both_llm_runners(folder, prompt: str, ids: list[int], new_tokens: int) -> dict[str, list]:
    """An ExecuTorch LLM-runner export folder run in a fresh process by `GenerationRunner` on `ids`
    (greedy, `new_tokens`) and by ExecuTorch's `TextLLMRunner` on `prompt`'s text (greedy; it stops
    at the program's EOS ids): `{"ours": token ids, "pieces": the runner's text pieces}`."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _BOTH_LLM_RUNNERS, str(folder), prompt, json.dumps(ids),
                           str(new_tokens)], capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def files_kept(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `folder` with its bytes and mode: what a refusal must keep."""
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mode)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def output_refusal(capsys) -> str:
    """The one line a command printed refusing an output path (`[output]`)."""
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("hfexport: error: [output] "), err
    return err


def whisper_variation(draw, mel_bins: bool = True) -> dict[str, int]:
    """A Whisper of other sizes than `tiny:whisper`'s, drawn from `draw` (a `random.Random`): width and
    heads, layers, and with `mel_bins` 80 or 128 mel bins (`build_preset("whisper", seed, **drawn)`)."""
    drawn = dict(d_model=draw.choice([16, 48, 64]), encoder_attention_heads=draw.choice([2, 4]),
                 encoder_layers=draw.randint(1, 3), decoder_layers=draw.randint(1, 3))
    if mel_bins:
        drawn["num_mel_bins"] = draw.choice([80, 128])
    drawn["decoder_attention_heads"] = drawn["encoder_attention_heads"]
    drawn["encoder_ffn_dim"] = drawn["decoder_ffn_dim"] = 2 * drawn["d_model"]
    return drawn


def eager_transcription(model, processor, clip: Path, new_tokens: int) -> list[int]:
    """Eager `generate()`'s new tokens on the feature extractor's features of the clip file's samples."""
    import soundfile

    samples, rate = soundfile.read(clip, dtype="float32")
    features = processor.feature_extractor(samples, sampling_rate=rate, return_tensors="pt")["input_features"]
    with torch.no_grad():
        out = model.generate(input_features=features, max_new_tokens=new_tokens, do_sample=False,
                             return_dict_in_generate=True, output_logits=True)
    return out.sequences[0, out.sequences.shape[1] - len(out.logits):].tolist()


_GENAI_SCRIPT = """
import json, sys
import onnxruntime_genai as og
model = og.Model(sys.argv[1])
prompt, new = json.loads(sys.argv[2]), int(sys.argv[3])
params = og.GeneratorParams(model)
params.set_search_options(max_length=len(prompt) + new, min_length=len(prompt) + new, do_sample=False)
generator = og.Generator(model, params)
generator.append_tokens([prompt])
tokens = []
while not generator.is_done():
    generator.generate_next_token()
    tokens.append(int(generator.get_next_tokens()[0]))
print(json.dumps(tokens))
"""


def genai_tokens_in_a_new_process(folder: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """`new_tokens` greedy tokens of onnxruntime-genai's `Generator` opening `folder` in a fresh
    process, as its docs run a model folder."""
    import json
    import subprocess
    import sys

    pytest.importorskip("onnxruntime_genai", reason="needs onnxruntime-genai: pip install 'hfexport[genai]'")
    done = subprocess.run([sys.executable, "-c", _GENAI_SCRIPT, str(folder), json.dumps(prompt), str(new_tokens)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
