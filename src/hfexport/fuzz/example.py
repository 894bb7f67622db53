"""What the fuzzer draws: the architectures it perturbs, an `Example` (model, prompt, cache and
backend), the hypothesis strategies that draw examples, and the eager model and inputs of one."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from collections.abc import Sequence
from typing import Any

import torch

from .outcomes import InvalidExample, first_lines

MODES = ("export", "generate")


@dataclasses.dataclass(frozen=True)
class Arch:
    """How a preset's config names what the fuzzer perturbs."""

    name: str
    heads: str = "num_attention_heads"
    kv_heads: str | None = "num_key_value_heads"  # None: as many key/value heads as query heads
    layers: str = "num_hidden_layers"
    hidden: tuple[str, ...] = ("hidden_size",)
    head_dim: str | None = None  # the config key of the per-head size; None: hidden = heads * head_dim
    sliding: str | None = None  # "window": sliding_window=w; "qwen": use_sliding_window + max_window_layers
    rope: str | None = "plain"  # "plain": rope_parameters; "per_layer_type": Gemma-3's dict; None: no rope
    seq2seq: bool = False


ARCHS: dict[str, Arch] = {a.name: a for a in [
    Arch("llama"),  # its preset leaves head_dim derived; qwen3, mistral and the Gemmas set it apart
    Arch("qwen3", head_dim="head_dim", sliding="qwen"),
    Arch("qwen2", sliding="qwen"),
    Arch("mistral", head_dim="head_dim", sliding="window"),
    Arch("gemma2", head_dim="head_dim", sliding="window"),
    Arch("gemma3_text", head_dim="head_dim", sliding="window", rope="per_layer_type"),
    Arch("phi3", sliding="window", rope=None),  # Phi-3's rope validator takes only its own scalings
    Arch("starcoder2", sliding="window"),
    Arch("mixtral", head_dim="head_dim", sliding="window"),
    Arch("qwen3_moe", head_dim="head_dim"),
    Arch("olmo2"),
    Arch("olmoe"),
    Arch("phi"),
    Arch("smollm3"),
    Arch("gpt_neox", kv_heads=None),
    Arch("falcon", kv_heads="num_kv_heads"),
    Arch("gpt2", heads="n_head", kv_heads=None, layers="n_layer", hidden=("n_embd",), rope=None),
    Arch("gptj", heads="n_head", kv_heads=None, layers="n_layer", hidden=("n_embd",), rope=None),
    Arch("opt", kv_heads=None, hidden=("hidden_size", "word_embed_proj_dim"), rope=None),
    Arch("bloom", heads="n_head", kv_heads=None, layers="n_layer", rope=None),
    Arch("t5", heads="num_heads", kv_heads=None, layers="num_layers", hidden=("d_model",), head_dim="d_kv",
         rope=None, seq2seq=True),
]}
#: The decoders drawn by default (`--archs` picks others; `--seq2seq` adds T5).
DEFAULT_ARCHS = tuple(name for name, arch in ARCHS.items() if not arch.seq2seq)
_ROPE_LINEAR = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
_GEMMA3_ROPE_LINEAR = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}


#: Bugs this fuzzer found that are still open, `(arch, backend, mode) -> what fails`: drawn no
#: more (like the coverage matrix's known failures) until fixed, so a run hunts for new ones.
#: Each is listed in the run's summary; remove an entry to hunt it again.
OPEN_FINDINGS: dict[tuple[str, str, str], str] = {
}


def _known_failure(arch: str, backend: str, modes: Sequence[str]) -> bool:
    """Whether the coverage matrix declares (arch, backend) failing in one of `modes`, or the
    fuzzer has an open finding there (`OPEN_FINDINGS`)."""
    from ..coverage.matrix import KNOWN_FAILURES

    return any((arch, backend, mode) in KNOWN_FAILURES or (arch, backend, mode) in OPEN_FINDINGS for mode in modes)


@dataclasses.dataclass(frozen=True)
class Example:
    """One drawn case: the model (preset, config overrides, seed), the prompt, the cache, the backend."""

    arch: str
    backend: str
    overrides: dict[str, Any]
    seed: int = 0
    batch: int = 1
    prompt_len: int = 8
    padding: int = 0  # left-padding positions of the last row (batch > 1)
    other_batch: int = 2
    other_len: int = 5
    cache: str = "dynamic"  # "dynamic" | "static"
    max_cache_len: int | None = None
    multi_token_decode: bool = False
    new_tokens: int = 4
    modes: tuple[str, ...] = MODES

    def to_json(self) -> str:
        """The example as one line of JSON (`--replay` takes it back)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Example:
        """The example `to_json` wrote."""
        data = json.loads(text)
        data["modes"] = tuple(data.get("modes", MODES))
        return cls(**data)

    def prompt(self, batch: int | None = None, length: int | None = None, padding: int | None = None,
               vocab_size: int = 128, pad_id: int = 0) -> dict[str, torch.Tensor]:
        """`input_ids` and `attention_mask` (the last row left-padded by `padding`), seeded by `seed`."""
        batch = self.batch if batch is None else batch
        length = self.prompt_len if length is None else length
        padding = self.padding if padding is None else min(padding, length - 1)
        generator = torch.Generator().manual_seed(self.seed)
        ids = torch.randint(3, vocab_size, (batch, length), generator=generator)
        mask = torch.ones_like(ids)
        if batch > 1 and padding:
            mask[-1, :padding] = 0
            ids[-1, :padding] = pad_id
        return {"input_ids": ids, "attention_mask": mask}

    def generation_config(self) -> Any:
        """The `GenerationConfig` of the generation part (`None`: the model's own, a dynamic cache)."""
        if self.cache != "static":
            return None
        from transformers import GenerationConfig

        return GenerationConfig(cache_implementation="static", max_cache_len=self.max_cache_len)

    def only(self, modes: Sequence[str]) -> Example:
        """This example run for `modes` only, the fields no other part reads at their defaults (so
        the examples shrinking draws that differ only there are one example)."""
        modes = tuple(m for m in self.modes if m in modes)
        reset: dict[str, Any] = {}
        if "generate" not in modes:
            reset.update(cache="dynamic", max_cache_len=None, multi_token_decode=False, new_tokens=4)
        if "export" not in modes:
            reset.update(other_batch=2, other_len=5)
        return dataclasses.replace(self, modes=modes, **reset)

    @property
    def runs_loop(self) -> bool:
        """Whether the runner and the decode loop apply (one sequence; a static cache's batch is fixed)."""
        return self.cache != "static" or self.batch == 1

    def label(self) -> str:
        """A short description for progress lines: architecture, backend, shapes, cache, decode."""
        cache = f"static {self.max_cache_len}" if self.cache == "static" else "dynamic"
        return (f"{self.arch} {self.backend} b={self.batch} L={self.prompt_len} pad={self.padding} {cache} "
                f"mtd={int(self.multi_token_decode)} K={self.new_tokens}")


@functools.lru_cache(maxsize=None)
def _preset_defaults(name: str) -> dict[str, Any]:
    """The config keyword arguments `build_preset(name)` passes or leaves at their default.

    # NOTE: not the built config's attributes: those hold derived values (Llama's head_dim is
    # hidden_size // heads), and dropping an override equal to one would change its meaning.
    """
    import inspect

    import transformers

    from ..presets import PRESETS

    preset = PRESETS[name]
    signature = inspect.signature(getattr(transformers, preset.config_class).__init__)
    defaults = {key: p.default for key, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}
    return {**defaults, **preset.config}


def _structure_overrides(arch: Arch, heads: int, kv: int, head_dim: int, layers: int) -> dict[str, Any]:
    """Config keys for the attention shape: heads, key/value heads, head size (or hidden size), layers."""
    out: dict[str, Any] = {arch.heads: heads, arch.layers: layers}
    if arch.kv_heads:
        out[arch.kv_heads] = kv
    if arch.head_dim:
        out[arch.head_dim] = head_dim
    else:
        out.update({key: heads * head_dim for key in arch.hidden})
    return out


def _window_overrides(arch: Arch, window: int | None, layers: int, full_layers: int) -> dict[str, Any]:
    """Config keys for a sliding window of `window` tokens (None: the preset's own)."""
    if window is None or arch.sliding is None:
        return {}
    if arch.sliding == "qwen":  # layers from max_window_layers on slide
        return {"use_sliding_window": True, "sliding_window": window, "max_window_layers": min(full_layers, layers - 1)}
    return {"sliding_window": window}


def _rope_overrides(arch: Arch, scaled: bool) -> dict[str, Any]:
    if not scaled or arch.rope is None:
        return {}
    return {"rope_parameters": copy.deepcopy(_GEMMA3_ROPE_LINEAR if arch.rope == "per_layer_type" else _ROPE_LINEAR)}


_MISSING = object()


def _without_defaults(arch: Arch, overrides: dict[str, Any]) -> dict[str, Any]:
    """Drop the overrides equal to the preset's own value (a shorter reproduction)."""
    defaults = _preset_defaults(arch.name)
    return {key: value for key, value in overrides.items() if defaults.get(key, _MISSING) != value}


def config_overrides(arch: Arch):
    """A strategy of `build_preset` overrides for `arch`; every first choice is the preset's own,
    so a shrunk example keeps only the overrides that matter."""
    from hypothesis import strategies as st

    @st.composite
    def draw_overrides(draw) -> dict[str, Any]:
        # some configs check hidden_size % heads even with their own head_dim (Gemma-2): keep it a divisor
        heads = draw(st.sampled_from((4, 2, 1, 8) if arch.head_dim else (4, 2, 1, 8, 6)))
        group = draw(st.sampled_from((2, 1, 4, 3)))  # query heads per key/value head, always one draw:
        # a shorter draw would shrink first.
        # Head sizes: the tiny ones first (they shrink there), then real models' (a kernel may take
        # another path at 128: OpenVINO's CPU plugin computed a Llama of head dim 128 wrong, none
        # below), on at most two heads so the model stays as small as the suite's time allows
        head_dim = draw(st.sampled_from((8, 4, 16, 64, 128)))
        if head_dim >= 64:
            heads = min(heads, 2)
        kv = heads // group if arch.kv_heads and heads % group == 0 else heads
        layers = draw(st.sampled_from((2, 1, 3)))
        out = _structure_overrides(arch, heads, kv, head_dim, layers)
        out["vocab_size"] = draw(st.sampled_from((128, 64, 97, 256)))
        if arch.sliding:
            window = draw(st.none() | st.integers(2, 8))
            out.update(_window_overrides(arch, window, layers, draw(st.integers(0, 2))))
        out.update(_rope_overrides(arch, draw(st.booleans())))
        tie = draw(st.sampled_from((None, True, False)))
        if tie is not None:
            out["tie_word_embeddings"] = tie
        for key, choices in (("pad_token_id", ("keep", 0, None)), ("eos_token_id", ("keep", None, 5)),
                             ("bos_token_id", ("keep", None))):
            value = draw(st.sampled_from(choices))
            if value != "keep":
                out[key] = value
        return _without_defaults(arch, out)

    return draw_overrides()


def examples(backends: Sequence[str] = ("dynamo",), archs: Sequence[str] = DEFAULT_ARCHS,
             modes: Sequence[str] = MODES):
    """The strategy of `Example`s: a backend, an architecture not declared failing on it, its
    config overrides, a prompt, another shape, a cache and the generation settings."""
    from hypothesis import strategies as st

    @st.composite
    def draw_example(draw) -> Example:
        backend = draw(st.sampled_from(list(backends)))
        allowed = [a for a in archs if not _known_failure(a, backend, modes)]
        if not allowed:
            raise ValueError(f"every architecture of {list(archs)} is a declared failure on {backend}")
        arch = ARCHS[draw(st.sampled_from(allowed))]
        overrides = draw(config_overrides(arch))
        batch, prompt_len = draw(st.integers(1, 3)), draw(st.integers(1, 12))
        padding = draw(st.integers(0, prompt_len - 1)) if batch > 1 else 0
        other_batch, other_len = draw(st.integers(1, 3)), draw(st.integers(1, 12))
        if (other_batch, other_len) == (batch, prompt_len):
            other_len = prompt_len % 12 + 1
        static = not arch.seq2seq and draw(st.booleans())
        new_tokens = draw(st.integers(1, 6))
        mtd = draw(st.booleans()) != static  # a static cache's main path (first choice) is multi-token decode
        max_cache_len = draw(st.integers(max(16, prompt_len + max(new_tokens, 3) + 1), 64)) if static else None
        return Example(arch.name, backend, overrides, draw(st.integers(0, 3)), batch, prompt_len, padding,
                       other_batch, other_len, "static" if static else "dynamic", max_cache_len, mtd, new_tokens,
                       tuple(modes))

    return draw_example()


def build_example(example: Example) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The eager model and the sample inputs of `example` (`InvalidExample` if eager cannot run them)."""
    from ..presets import build_preset

    try:
        model, _ = build_preset(example.arch, example.seed, **example.overrides)
    except Exception as error:  # noqa: BLE001 - a config the model class (or its validators) refuses
        raise InvalidExample(f"the config is not valid: {first_lines(error, 1)}") from error
    return model, sample_inputs(example, model)


def sample_inputs(example: Example, model: torch.nn.Module, other: bool = False) -> dict[str, torch.Tensor]:
    """The prompt of `example` (`other`: at its other shape, `other_batch` x `other_len`), with
    three decoder tokens for an encoder-decoder model."""
    batch, length = (example.other_batch, example.other_len) if other else (example.batch, example.prompt_len)
    inputs = example.prompt(batch, length, example.padding, vocab_size=model.config.vocab_size,
                            pad_id=model.config.pad_token_id or 0)
    if ARCHS[example.arch].seq2seq:
        start = model.config.decoder_start_token_id or 0
        inputs["decoder_input_ids"] = torch.tensor([[start, 5, 9]]).repeat(batch, 1)
    return inputs
