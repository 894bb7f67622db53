"""`LlmProgram`: a causal LM as the one-method program ExecuTorch's own LLM runner loads.

```
forward(input_ids [1, q], input_pos [1]) -> logits [1, 1, vocab]     (q: 1 .. max_cache_len)
  the key/value cache: two mutable buffers per layer inside the program, [1, max_cache_len, kv_heads, head_dim],
  written in place by llama::update_cache at input_pos, attended by llama::custom_sdpa over slots [0, input_pos + q)
```
One method prefills a prompt and decodes any number of new tokens (`enable_dynamic_shape`); the
constant methods `get_max_seq_len`, `get_max_context_len`, `get_vocab_size`, `get_bos_id`,
`get_eos_ids`, `use_kv_cache`, `use_sdpa_with_kv_cache` and `enable_dynamic_shape` are what
`executorch.extension.llm.runner.TextLLMRunner` reads (names from executorch 1.4.1
`extension/llm/runner/constants.h`).
Which exports get this program (the default of a static-cache export folder) and the
tokenizer file beside it: `llm_export.py`.

# NOTE: no per-architecture code. The model runs its own forward with two of transformers' own
# extension points swapped in: its attention goes through `AttentionInterface` under
# `ATTENTION` (`program_attention`), and its cache is a `transformers.cache_utils.Cache` whose
# layers (`ProgramCacheLayer`) write into this module's buffers. With an attention name that
# has no mask function, transformers 5.24's `create_causal_mask` returns no mask
# (`masking_utils._preprocess_mask_arguments`), so nothing of the cache's length is built per step.
# A layer whose attention the op cannot express (logit softcapping, a mask the model builds
# itself) attends with plain torch ops over its own buffers, and the record says which layers and
# why (`record.details["llm_program"]`); attention arguments neither can apply (sinks) are refused.
# Built, the program is checked against the model's own forward (`_check_against_model`): the
# export validates against this module, so this is what ties the artifact to the model.
#
# NOTE: `llama::update_cache` and `llama::custom_sdpa` compute in float32 (executorch 1.4.1's
# eager kernels return float32 for float16 queries; its own Llama export casts to float32 around
# them, `examples/models/llama/source_transformation/sdpa.py`, "Custom op only supports float32").
# A 16-bit model's op layers therefore keep their cache in float32 and attend in float32, the
# result cast back to the model's dtype; the rest of the program keeps the model's dtype.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

import torch

from ...capture.prepare import model_name
from ...errors import PrepareError
from ...model_config import text_config

__all__ = ["LlmProgram", "ATTENTION", "OPT_OUT"]

#: The remedy of a refusal: the static-cache components, which take the cache as method inputs.
OPT_OUT = ("export with llm_runner=False (--no-llm-runner): the static-cache components, the cache as method "
           "inputs (hfexport generate runs them; TextLLMRunner cannot)")

#: The name `program_attention` is registered under in transformers' `AttentionInterface`.
ATTENTION = "hfexport_executorch_llm"

#: The program running now (`LlmProgram.forward`), which `program_attention` reads its step from.
_RUNNING: contextvars.ContextVar[LlmProgram] = contextvars.ContextVar("hfexport_llm_program")


@dataclasses.dataclass
class LayerAttention:
    """How one layer attends in the program: `op` is `custom_sdpa` (causal, over the written
    slots), `custom_sdpa+window` (a window mask over the cache) or `torch` (the fallback), with why."""

    op: str
    why: str = ""


class _LayerCache(torch.nn.Module):
    """One layer's key and value buffers: `[1, max_cache_len, kv_heads, head_dim]` (update_cache's
    layout), or for a layer that attends with torch ops keys `[1, kv_heads, head_dim,
    max_cache_len]` and values `[1, kv_heads, max_cache_len, head_dim]` (`_torch_attention`)."""

    def __init__(self, keys: tuple[int, ...], values: tuple[int, ...], dtype: torch.dtype):
        super().__init__()
        self.register_buffer("keys", torch.zeros(keys, dtype=dtype), persistent=False)
        self.register_buffer("values", torch.zeros(values, dtype=dtype), persistent=False)


def _program_layer(program: LlmProgram, index: int) -> Any:
    """A `transformers` cache layer over `program`'s buffers for layer `index` (see `_layer_class`)."""
    return _layer_class()(program, index)


@functools.cache
def _layer_class() -> type:
    from transformers.cache_utils import CacheLayerMixin

    class ProgramCacheLayer(CacheLayerMixin):
        """A cache layer whose tensors are `LlmProgram`'s buffers: `update` writes the new keys
        and values at the running step's start position and returns the whole buffers (the
        attention reads only what the step may see). While the program plans its layers, it
        records each layer's key/value heads and head size instead."""

        is_compileable = True

        def __init__(self, program: LlmProgram, index: int):
            super().__init__()
            self.program, self.index, self.is_initialized = program, index, True

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            pass

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            program = self.program
            if program.planning is not None:
                program.planning[self.index] = (key_states.shape[1], key_states.shape[-1])
                return key_states, value_states
            buffers, start = program.caches[self.index], program.step_start
            if program.attention[self.index].op == "torch":  # keys stored transposed (`_torch_attention`)
                positions = start + torch.arange(key_states.shape[-2])
                buffers.keys.index_copy_(3, positions, key_states.transpose(-1, -2))
                buffers.values.index_copy_(2, positions, value_states)
            else:
                torch.ops.llama.update_cache(key_states.transpose(1, 2).to(buffers.keys.dtype).contiguous(),
                                             buffers.keys, start)
                torch.ops.llama.update_cache(value_states.transpose(1, 2).to(buffers.values.dtype).contiguous(),
                                             buffers.values, start)
            return buffers.keys, buffers.values

        def get_seq_length(self) -> int:
            return self.program.step_start

        def get_max_length(self) -> int:
            return self.program.max_cache_len

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.program.max_cache_len, 0

    return ProgramCacheLayer


def _program_cache(program: LlmProgram) -> Any:
    """A `transformers.Cache` over `program`'s buffers (built per call: it holds no tensors)."""
    from transformers.cache_utils import Cache

    return Cache(layers=[_program_layer(program, i) for i in range(_num_layers(program.model))])


def program_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None, **kwargs: Any):
    """Attention of one layer inside `LlmProgram` (registered as `ATTENTION`): `query` is
    `[1, heads, q, head_dim]`, `key`/`value` the layer's whole buffers as `ProgramCacheLayer`
    returned them. Returns `([1, q, heads, head_dim], None)`, as transformers' sdpa does."""
    program = _RUNNING.get(None)
    if program is None:
        raise RuntimeError(f"{ATTENTION} attention runs only inside LlmProgram.forward")
    layer = getattr(module, "layer_idx", None)
    plan = program.plan_layer(layer, sliding_window=sliding_window, softcap=softcap,
                              own_mask=attention_mask is not None, extra=kwargs)
    start, length = program.step_start, query.shape[-2]
    if program.planning is not None:
        return query.new_zeros(query.transpose(1, 2).shape), None
    if plan.op == "torch":
        return _torch_attention(query, key, value, program.window_mask(length, sliding_window, boolean=True),
                                scaling, softcap), None
    q = query.transpose(1, 2).to(key.dtype).contiguous()  # float32, the ops' dtype (see the module note)
    if plan.op == "custom_sdpa+window":
        out = torch.ops.llama.custom_sdpa(q, key, value, start, program.window_mask(length, sliding_window), 0.0,
                                          False, scaling)
    else:
        out = torch.ops.llama.custom_sdpa(q, key, value, start, None, 0.0, True, scaling)
    return out.to(query.dtype), None


def _torch_attention(query, keys, values, allowed, scaling, softcap):
    """The fallback: `query [1, heads, q, d]` over the layer's buffers, keys `[1, kv_heads, d,
    max_cache_len]` (stored transposed) and values `[1, kv_heads, max_cache_len, d]`, with
    `allowed [q, max_cache_len]`, in torch ops (softcapping applied). One batched product per
    query head of each key/value head, so no buffer is transposed or repeated: a step reads the
    buffers and copies nothing of them."""
    _, heads, length, dim = query.shape  # batch 1: the program's cache holds one sequence
    kv_heads, slots = keys.shape[1], keys.shape[-1]
    groups = heads // kv_heads
    grouped = query.reshape(kv_heads, groups, length, dim)
    keys, values = keys.view(kv_heads, dim, slots), values.view(kv_heads, slots, dim)
    outs = []
    for group in range(groups):  # the query heads sharing key/value head k are k * groups + group
        scores = torch.bmm(grouped[:, group], keys) * (scaling if scaling is not None else dim ** -0.5)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        outs.append(torch.bmm(torch.softmax(scores.float(), dim=-1).to(query.dtype), values))
    return torch.stack(outs, dim=1).reshape(1, heads, length, dim).transpose(1, 2).contiguous()


#: Attention kwargs that do not change the math `program_attention` does.
_NEUTRAL = frozenset({"position_ids", "cache_position", "output_attentions", "output_hidden_states",
                      "output_router_logits", "return_dict", "use_cache", "is_causal", "position_embeddings", "cache",
                      "past_key_values", "layer_idx"})


class LlmProgram(torch.nn.Module):
    """`model` (a causal LM) as `forward(input_ids, input_pos) -> logits`, its key/value cache of
    `max_cache_len` tokens held in this module's buffers (see the module docstring).

    Args:
        model: a `PreTrainedModel` whose attention follows transformers' `AttentionInterface`.
        max_cache_len: the cache's length in tokens (prompt and new tokens together).

    Raises:
        PrepareError: the model's attention does not go through `AttentionInterface` (BLOOM's
            alibi, ...), or a layer attends without a cache.
    """

    def __init__(self, model: torch.nn.Module, max_cache_len: int):
        super().__init__()
        _load_ops()
        self.model = model
        self.max_cache_len = int(max_cache_len)
        self.step_start: Any = 0
        name = model_name(model)
        if not getattr(model, "_can_set_attn_implementation", lambda: False)():
            raise PrepareError(f"{name}'s attention does not go through transformers' AttentionInterface, so "
                               "its cache cannot live inside the program", model=name,
                               remedy=OPT_OUT)
        self.attention: dict[int, LayerAttention] = {}
        self.caches = torch.nn.ModuleList()
        shapes = self._probe()
        dtype = next(model.parameters()).dtype
        for index in range(len(shapes)):
            heads, head_dim = shapes[index]
            if self.attention[index].op == "torch":
                keys, values = (1, heads, head_dim, self.max_cache_len), (1, heads, self.max_cache_len, head_dim)
                self.caches.append(_LayerCache(keys, values, dtype))
            else:  # the ops' dtype (see the module note)
                keys = values = (1, self.max_cache_len, heads, head_dim)
                self.caches.append(_LayerCache(keys, values, torch.float32))
        self._check_against_model()

    # -- planning -------------------------------------------------------------------------------

    def _probe(self) -> list[tuple[int, int]]:
        """Run the model once on one token: each layer's key/value heads and head size (recorded
        by the cache layers), and how its attention is called (`plan_layer`)."""
        self.planning: dict[int, tuple[int, int]] | None = {}
        try:
            with torch.no_grad(), self._running(0):
                self.model(input_ids=torch.zeros((1, 1), dtype=torch.long),
                           position_ids=torch.zeros((1, 1), dtype=torch.long),
                           **{_cache_argument(self.model): _program_cache(self)}, use_cache=True)
            shapes = self.planning
        except PrepareError:
            raise
        except (TypeError, ValueError, RuntimeError, AttributeError, KeyError, IndexError) as error:
            # a forward that does not run on token ids and positions over this cache (its own cache
            # class, inputs it requires): the program cannot be this model, which is a prepare error
            name = model_name(self.model)
            raise PrepareError(f"{name}'s forward did not run with its cache in the program "
                               f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})",
                               model=name, remedy=OPT_OUT) from error
        finally:
            self.planning = None
        layers = _num_layers(self.model)
        missing = sorted(set(range(layers)) - (set(shapes) & set(self.attention)))
        if missing:
            name = model_name(self.model)
            raise PrepareError(f"layers {missing} of {name} did not attend through transformers' "
                               "AttentionInterface with the cache", model=name,
                               remedy=OPT_OUT)
        return [shapes[i] for i in range(layers)]

    def _check_against_model(self) -> None:
        """The program's logits for a 3-token prompt then one more token equal the model's own
        forward on the 4 tokens (within 1e-3 of the logits' scale, or 4 epsilons of a 16-bit
        model's dtype: its float32 attention rounds otherwise than the model's), or `PrepareError`."""
        vocab = int(text_config(self.model.config).vocab_size)
        ids = (torch.arange(4) * 7 + 3)[None] % vocab
        with torch.no_grad():
            want = self.model(input_ids=ids, use_cache=False).logits[0, -1].float()
            self.run_tokens(ids[:, :3], torch.tensor([0]))
            got = self.run_tokens(ids[:, 3:], torch.tensor([3]))["logits"][0, -1].float()
        error = float((got - want).abs().max())
        relative = max(1e-3, 4 * torch.finfo(next(self.model.parameters()).dtype).eps)
        if error > relative * float(want.abs().max()) + 1e-4:
            name = model_name(self.model)
            raise PrepareError(f"{name} with its cache in the program gives other logits than its own forward "
                               f"(max abs difference {error:.3g}; layers by op: {self.plan_summary()['layers_by_op']})",
                               model=name, remedy=f"{OPT_OUT}, and report the model to hfexport")

    def plan_layer(self, layer: int | None, *, sliding_window: int | None, softcap: float | None, own_mask: bool,
                   extra: dict[str, Any]) -> LayerAttention:
        """How `layer` attends (decided on the probe call, then looked up)."""
        if self.planning is None:
            return self.attention[layer]
        if layer is None:
            raise PrepareError(f"an attention module of {model_name(self.model)} has no layer_idx",
                               model=model_name(self.model), remedy=OPT_OUT)
        unknown = sorted(k for k, v in extra.items() if v is not None and k not in _NEUTRAL and not k.startswith("_"))
        if unknown:  # attention sinks (`s_aux`), biases: neither the op nor the fallback would apply them
            raise PrepareError(f"layer {layer} of {model_name(self.model)} attends with arguments the program cannot "
                               f"apply: {', '.join(unknown)}", model=model_name(self.model),
                               remedy=OPT_OUT)
        if softcap is not None:
            plan = LayerAttention("torch", f"attention logit softcapping ({softcap}): custom_sdpa has none")
        elif own_mask:
            plan = LayerAttention("torch", "the model builds its own attention mask: custom_sdpa takes none of its form")
        elif sliding_window is not None and sliding_window < self.max_cache_len:
            plan = LayerAttention("custom_sdpa+window", f"a window of {sliding_window} < the cache's "
                                  f"{self.max_cache_len}: a mask over every slot (the op reads them all per step)")
        else:
            plan = LayerAttention("custom_sdpa")
        self.attention[layer] = plan
        return plan

    def window_mask(self, length: int, window: int | None, boolean: bool = False) -> torch.Tensor:
        """`[length, max_cache_len]`: which slots each new token sees (causal, within `window`);
        additive (0 / -inf) unless `boolean`."""
        positions = self.step_start + torch.arange(length)[:, None]
        slots = torch.arange(self.max_cache_len)[None, :]
        allowed = slots <= positions
        if window is not None:
            allowed = allowed & (slots > positions - window)
        if boolean:
            return allowed
        return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))

    def plan_summary(self) -> dict[str, Any]:
        """What the record says of the program's attention: layers per op, and each fallback's reason."""
        ops: dict[str, list[int]] = {}
        for index, plan in sorted(self.attention.items()):
            ops.setdefault(plan.op, []).append(index)
        reasons = {str(i): plan.why for i, plan in sorted(self.attention.items()) if plan.why}
        return {"layers_by_op": ops, **({"why": reasons} if reasons else {}), "max_cache_len": self.max_cache_len}

    # -- running --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _running(self, start: Any) -> Iterator[None]:
        configs = _attention_configs(self.model)
        saved = [config._attn_implementation for config in configs]
        token = _RUNNING.set(self)
        self.step_start = start
        try:
            for config in configs:
                config._attn_implementation = ATTENTION
            yield
        finally:
            for config, value in zip(configs, saved):
                config._attn_implementation = value
            _RUNNING.reset(token)

    def forward(self, input_ids: torch.Tensor, input_pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """`{"logits": [1, 1, vocab]}`, of the last of `input_ids` (`[1, q]`, written at
        `input_pos[0]` .. `+ q`)."""
        return self._step(input_pos, input_ids=input_ids)

    def run_tokens(self, input_ids: torch.Tensor, input_pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """`forward` on token ids, whatever this program's method takes (`EmbeddedLlmProgram`: embeddings)."""
        return LlmProgram.forward(self, input_ids, input_pos)

    def _step(self, input_pos: torch.Tensor, **tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """The model on `tokens` (`input_ids` `[1, q]` or `inputs_embeds` `[1, q, hidden]`) written
        at `input_pos[0]` .. `+ q`: `{"logits": [1, 1, vocab]}` of the last one."""
        length = next(iter(tokens.values())).shape[1]
        start = input_pos[0].item()
        torch._check(start >= 0)
        torch._check(start + length <= self.max_cache_len)
        positions = (input_pos[:1] + torch.arange(length))[None]
        with self._running(start):
            out = self.model(**tokens, position_ids=positions,
                             **{_cache_argument(self.model): _program_cache(self)}, use_cache=True, logits_to_keep=1)
        return {"logits": out.logits}

    def dynamic_shapes(self) -> dict[str, Any]:
        """`torch.export`'s dynamic shapes: any number of tokens up to the cache's length, one start position."""
        return {"input_ids": {1: torch.export.Dim("tokens", min=1, max=self.max_cache_len)}, "input_pos": None}

    def constant_methods(self) -> dict[str, Any]:
        """The metadata ExecuTorch's LLM runner reads from the program (executorch 1.4.1)."""
        text = text_config(self.model.config)
        generation = getattr(self.model, "generation_config", None)
        bos = getattr(generation, "bos_token_id", None)
        bos = bos if bos is not None else getattr(text, "bos_token_id", None)
        eos = [getattr(generation, "eos_token_id", None), getattr(text, "eos_token_id", None)]
        eos_ids = sorted({int(e) for value in eos for e in ([value] if isinstance(value, int) else value or [])})
        methods = {"get_max_seq_len": self.max_cache_len, "get_max_context_len": self.max_cache_len,
                   "get_vocab_size": int(text.vocab_size), "use_kv_cache": True, "use_sdpa_with_kv_cache": False,
                   "enable_dynamic_shape": True}
        if bos is not None:
            methods["get_bos_id"] = int(bos[0] if isinstance(bos, (list, tuple)) else bos)
        if eos_ids:
            methods["get_eos_ids"] = eos_ids
        return methods


def _load_ops() -> None:
    """Register `llama::update_cache` and `llama::custom_sdpa` with torch (their eager kernels and
    their shapes for tracing): importing executorch 1.4.1's module loads its library."""
    import importlib

    from .runner import KERNEL_LIBRARIES

    importlib.import_module(KERNEL_LIBRARIES["llama"])


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, program_attention)


def _attention_configs(model: torch.nn.Module) -> list[Any]:
    """Every config object the model's modules read `_attn_implementation` from."""
    _register_attention()
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            seen.setdefault(id(config), config)
    return list(seen.values())


def _num_layers(model: torch.nn.Module) -> int:
    return int(text_config(model.config).num_hidden_layers)


def _cache_argument(model: torch.nn.Module) -> str:
    """The name the model's forward takes its cache under (`cache` in transformers 5.24,
    `past_key_values` before)."""
    import inspect

    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"
