"""`ExecutorchExporter`: the captured program lowered to an ExecuTorch `.pte` (XNNPACK by default).

```
capture (shared) -> to_edge_transform_and_lower(fold weight-only math, [weights tagged], dtypes checked once,
                                                   partitioner; ExecuTorch's IR checks off: edge_check.py)
        -> to_executorch(views bounded by their base, memory planning, [external constants]) -> plan checks
```
Ops the delegate cannot take stay on ExecuTorch's portable kernels; the record counts both. With
`ExecutorchConfig.external_weights`, the weights go to `<name>.ptd` beside `<name>.pte` (`external.py`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from ...capture.dynamic import grown_sample, has_fixed_batch
from ...capture.names import ATTENDED_ROLE
from ...capture.prepare import model_name
from ...capture.pytree import is_static_cache
from ...capture.record import ExportRecord
from ...capture.trace import Capture
from ...errors import ConversionError, PrepareError
from ...exporter import HfExporter
from ...folder.manifest import FileBytes
from ...model_config import text_config
from . import package  # noqa: F401  (registers the format's runtime packages)
from .compat import data_payloads
from .config import ExecutorchConfig
from .copies import drop_identity_copies
from .delegates import check_delegate, partitioners
from .edge_check import checked_dtypes, edge_compile_config
from .external import external_reason, tag_delegated_weights, weights_tag
from .folding import fold_weight_only_math
from .planning import ViewsBoundedByBase, check_plan

__all__ = ["ExecutorchExporter"]

logger = logging.getLogger("hfexport")

#: Used for a dynamic dimension of unknown role when the config gives no better bound.
FALLBACK_MAX = 4096

#: A dynamic program planning more than this for intermediates gets a warning at export.
LARGE_PLAN = 2**30


class ExecutorchExporter(HfExporter):
    """Export to an `executorch.exir.ExecutorchProgramManager`.

    ```python
    et_program = ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(dynamic=True))
    et_program.save("model.pte")
    method = Runtime.get().load_program("model.pte").load_method("forward")
    outputs = method.execute(list(inputs.values()))
    ```
    The program's inputs are the `inputs` dict's tensors, in order (caches flattened). Its weights
    are in the `.pte` unless `ExecutorchConfig(external_weights=True)`; then `save` writes
    `model.ptd` beside it (`HfExecutorchProgram.save`, which says how to load the pair).
    """

    format = "executorch"
    config_class = ExecutorchConfig
    extra = "executorch"
    fix_order = ("fix_split_outputs_as_slices", "fix_mean_last_dim_as_global_pooling")

    def export_components(self, components, config=None, **options):
        """As `HfExporter.export_components`; the LLM-runner programs (`llm.LlmProgram`,
        `multimodal.MultimodalProgram`) take any number of tokens per call up to their cache, the
        dynamic shapes each declares (the other components keep `config`'s)."""
        from .llm import LlmProgram
        from .multimodal import MultimodalProgram

        own = {name: module.dynamic_shapes() for name, (module, _) in components.items()
               if isinstance(module, (LlmProgram, MultimodalProgram))}
        if not own or config is None or config.dynamic_shapes is not None:
            return super().export_components(components, config, **options)
        rest = {name: part for name, part in components.items() if name not in own}
        artifacts = super().export_components(rest, config, **options) if rest else {}
        for name, shapes in own.items():
            artifacts.update(super().export_components({name: components[name]}, config.replace(dynamic_shapes=shapes),
                                                       **options))
        return {name: artifacts[name] for name in components}

    def _check_model(self, model, inputs: dict[str, Any], config: ExecutorchConfig) -> None:
        check_delegate(config.delegate, model_name(model))
        if config.delegate == "mlx":
            from transformers import StaticCache

            if any(isinstance(v, StaticCache) for v in inputs.values()):
                raise PrepareError(
                    "the MLX delegate does not take a StaticCache",
                    model=model_name(model),
                    remedy="export with a DynamicCache (the default of generate()), or use delegate='xnnpack'",
                )

    def _quantize_program(self, captured: Capture, model, sample, config: ExecutorchConfig, bounds) -> Capture:
        from ...quantization.pt2e import PT2EQuantizer

        quantizer, why = config.quantizer, _xnnpack_static_unsafe(model)
        if why is None or not isinstance(quantizer, PT2EQuantizer):
            return super()._quantize_program(captured, model, sample, config, bounds)
        # A dynamic config annotates linears only anyway: nothing is dropped and nothing recorded.
        with quantizer.annotating_only(_STATIC_SAFE_OPS, why):
            return super()._quantize_program(captured, model, sample, config, bounds)

    def _capture_sample(self, inputs: dict[str, Any], config: ExecutorchConfig) -> dict[str, Any]:
        # ExecuTorch's edge passes bound a symbol whose sample size is 1 to at most 2 (measured with
        # executorch 1.4.1: a batch-1 Llama planned a batch of 2), so trace with a batch of 2. A
        # one-token prompt is traced at two tokens too: a size-1 axis leaves a tensor's dim order
        # ambiguous, and the planned orders disagreed (a one-token Llama's rotary `cat` failed,
        # "input tensors have different dim orders", error 0x12, at every size); a decode step's
        # single token stays 1 (static), as does a static cache's batch and an encoder-decoder's
        # first decoder token.
        return grown_sample(inputs, config, batch=True)

    def _dim_bounds(self, model, inputs: dict[str, Any], config: ExecutorchConfig) -> ConfigBounds:
        return ConfigBounds(model, inputs, config)

    def _convert(self, captured: Capture, record: ExportRecord, model: torch.nn.Module, inputs: dict[str, Any],
                 config: ExecutorchConfig):
        from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
        from executorch.exir.passes import MemoryPlanningPass

        external = external_reason(config, captured.program)
        passes = [fold_weight_only_math(), drop_identity_copies(), *([tag_delegated_weights()] if external else []),
                  checked_dtypes()]
        edge = to_edge_transform_and_lower(_methods(captured, model), transform_passes=passes,
                                           partitioner=partitioners(config.delegate, dynamic_quant=_dynamic_quant(captured.program)),
                                           constant_methods=_constant_methods(model),
                                           compile_config=edge_compile_config())
        planning = MemoryPlanningPass(
            alloc_graph_input=config.alloc_graph_input,
            alloc_graph_output=config.alloc_graph_output,
            alloc_mutable_buffers=config.alloc_mutable_buffers,
        )
        bounds = ViewsBoundedByBase()
        program = edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=planning,
                                                             sym_shape_eval_pass=bounds,
                                                             do_quant_fusion_and_const_prop=_quantized_embedding(config),
                                                             run_reinplace_pass=_constant_methods(model) is not None,
                                                             external_constants=weights_tag if external else False))
        program.hfexport_method = _method_name(model)
        _check_plan_size(program, captured, model)
        if problems := check_plan(program):
            raise ConversionError(
                f"ExecuTorch's memory plan puts {len(problems)} tensor(s) outside their storage (the program "
                f"would fail to load, error 0x21, or overwrite live tensors): {'; '.join(problems[:3])}",
                model=model_name(model),
                remedy="export with dynamic=False, or bound the dims with dynamic_shapes={...: Dim(max=...)}; "
                "please report the model to hfexport",
            )
        program.hfexport_capped_views = bounds.capped
        program.hfexport_llm_program = _llm_program_summary(model)
        program.hfexport_multimodal_program = model.summary() if _is_multimodal(model) else None
        program.hfexport_external_weights = external
        from .artifact import HfExecutorchProgram

        return HfExecutorchProgram.wrap(program)

    def _record(self, record: ExportRecord, captured: Capture, artifact, config: ExecutorchConfig) -> None:
        record.details["delegation"] = delegation_summary(artifact, config.delegate)
        if (method := getattr(artifact, "hfexport_method", "forward")) != "forward":
            record.details["method"] = method  # the one `ExecutorchRunner` runs (validation)
        if llm_program := getattr(artifact, "hfexport_llm_program", None):
            record.details["llm_program"] = llm_program
        elif multimodal := getattr(artifact, "hfexport_multimodal_program", None):
            record.details["multimodal_program"] = multimodal
        elif record.details.get("input_mutations") and any(n.startswith("cache.") for n in record.input_names):
            record.details["llm_custom_ops"] = {"used": False, "reason": _LLM_OPS_NOT_USED}
        if libraries := kernel_libraries(artifact):
            record.details["kernel_libraries"] = libraries
        # what the runtime allocates for intermediates when it loads the method (at the dims' bounds)
        record.details["planned_memory"] = _gib(_planned_bytes(artifact))
        if capped := getattr(artifact, "hfexport_capped_views", None):
            record.details["views_bounded_by_base"] = capped
        if data_payloads(artifact):
            # the file's name, size and fingerprint are added when it is written (`_write`)
            reason = getattr(artifact, "hfexport_external_weights", None) or f"the {config.delegate} delegate's own"
            record.details["external_weights"] = {"reason": reason}

    def _write(self, artifact, stem: Path) -> list[Path]:
        """The `.pte`, streamed to its file, and, when the weights live outside it, the `.ptd`
        (`artifact.write_executorch`, what the program's own `save` writes too)."""
        from .artifact import write_executorch

        return write_executorch(artifact, stem)

    def _load(self, files: list[FileBytes]) -> Any:
        from .artifact import PteBuffer

        return PteBuffer.of(files)


#: Why a static-cache component does not use ExecuTorch's LLM ops (`executorch.extension.llm.custom_ops`).
_LLM_OPS_NOT_USED = (
    "the cache is a method input (the documented interface: [input_ids, attention_mask, position_ids, cache x N], "
    "[batch, heads, length, head_dim]), written with aten.index_put.out then copy_ back into the input; "
    "update_cache and custom_sdpa need it as mutable program buffers laid out [batch, length, heads, head_dim], "
    "as the LLM-runner program holds it (GenerationOptions(static_cache=N), llm_runner=None or True; "
    "bench/RESULTS.md: here a step costs what max_cache_len costs)")


def _constant_methods(model: torch.nn.Module) -> dict[str, Any] | None:
    """The constant methods an `LlmProgram` or a `MultimodalProgram` carries for ExecuTorch's LLM
    runners (none for other models)."""
    from .llm import LlmProgram

    return model.constant_methods() if isinstance(model, LlmProgram) or _is_multimodal(model) else None


def _is_multimodal(model: torch.nn.Module) -> bool:
    from .multimodal import MultimodalProgram

    return isinstance(model, MultimodalProgram)


def _method_name(model: torch.nn.Module) -> str:
    """The method the captured program becomes: `forward`, or a `MultimodalProgram`'s `text_decoder`."""
    from .multimodal import DECODER_METHOD

    return DECODER_METHOD if _is_multimodal(model) else "forward"


def _methods(captured: Capture, model: torch.nn.Module) -> Any:
    """What `to_edge_transform_and_lower` lowers: the captured program, or a `MultimodalProgram`'s
    methods by name (its other methods captured now, `multimodal.method_programs`)."""
    if not _is_multimodal(model):
        return captured.program
    from .multimodal import method_programs

    return {_method_name(model): captured.program, **method_programs(model)}


def _llm_program_summary(model: torch.nn.Module) -> dict[str, Any] | None:
    """For an `LlmProgram`: how each layer attends and the constant methods (`record.details["llm_program"]`)."""
    from .llm import LlmProgram

    if not isinstance(model, LlmProgram):
        return None
    return {**model.plan_summary(), "constant_methods": model.constant_methods()}


def _dynamic_quant(program: Any) -> bool:
    """Whether `program` quantizes activations at run time (PT2E's `choose_qparams`), whatever
    quantizer made it: the built-in scheme or a user's PT2E quantizer object."""
    return any(node.op == "call_function" and "choose_qparams" in str(node.target) for node in program.graph.nodes)


#: The ops whose static int8 annotations ExecuTorch 1.4.1's XNNPACK runs in a decoder with rotary
#: embeddings or RMSNorm (`_xnnpack_static_safe`): linears and convolutions.
_STATIC_SAFE_OPS = frozenset({
    torch.ops.aten.linear.default, torch.ops.aten.conv1d.default, torch.ops.aten.conv2d.default,
    torch.ops.aten.conv3d.default, torch.ops.aten.convolution.default})


def _xnnpack_static_unsafe(model: torch.nn.Module) -> str | None:
    """Why a statically quantized `model` keeps int8 on its linears and convolutions only on
    ExecuTorch, or `None` where the quantizer's whole annotation runs.

    # NOTE: measured with executorch 1.4.1 on tiny Qwen3/Llama, the static per-channel XNNPACK
    # config annotating everything (docs/executorch_static_int8_rotary.md): (1) RoPE's slices
    # get the cat's qparams on their output (the quantizer shares through `slice_copy`, but sees
    # `aten.slice.Tensor`; fixed by pytorch/executorch#21568, after 1.4.1;
    # docs/repro_xnnpack_static_slice.py) and XNNPACK's static slice refuses them: `load_method`
    # fails, then a double free kills the process; (2) with that mended, a statically quantized
    # `mul` in RMSNorm or the gated MLP corrupts the heap (cosine 0.78-0.87 to eager, a double
    # free at exit). With the linears alone quantized the programs load, run at cosine 0.9999 and
    # exit cleanly; encoders with LayerNorm and no rotary (BERT, ViT) run fully annotated.
    """
    names = {type(m).__name__ for m in model.modules()}
    rotary = sorted(n for n in names if n.endswith("RotaryEmbedding"))
    rms = sorted(n for n in names if n.endswith("RMSNorm"))
    if not rotary and not rms:
        return None
    found = ", ".join([*rotary, *rms])
    return (f"ExecuTorch 1.4.1's XNNPACK fails on statically quantized rotary slices and RMSNorm/MLP products "
            f"({found}: pytorch/executorch#21568, docs/executorch_static_int8_rotary.md); linears and "
            "convolutions keep int8, the ops between them run in float")


def _quantized_embedding(config: ExecutorchConfig) -> bool:
    # NOTE: a weight-only quantized embedding reaches the edge as torchao's `dequantize_affine` ->
    # `embedding`, which has no ExecuTorch kernel ("Missing out variants: torchao::dequantize_affine");
    # ExecuTorch's quant fusion rewrites it into `quantized_decomposed::embedding_{4bit,byte}`,
    # which reads only the looked-up rows (as ExecuTorch's LLM export does).
    return getattr(config.quantizer, "embedding_bits", None) is not None


#: The config attributes that name a model's position limit, in the order they are read: T5's
#: checkpoints name theirs only as `n_positions` (t5-small's config.json: 512, its training length;
#: T5's relative positions set no limit of their own), which `T5Config` keeps as a plain attribute.
POSITION_LIMITS = ("max_position_embeddings", "max_target_positions", "n_positions")
#: An encoder-decoder's encoder names its own limit where it differs from the decoder's (Whisper's
#: `max_source_positions`, Speech2Text's); T5 and BART share one.
ENCODER_POSITION_LIMITS = ("max_source_positions", *POSITION_LIMITS)


def position_limit(model_config: Any, attributes: tuple[str, ...] = POSITION_LIMITS) -> tuple[int, str] | None:
    """`(positions, attribute)`: the first of `attributes` the config (its text config first)
    gives, or None."""
    for attribute in attributes:
        for where in (text_config(model_config), model_config):
            if isinstance(value := getattr(where, attribute, None), int) and value > 0:
                return value, attribute
    return None


class ConfigBounds:
    """Upper bounds for dynamic dims, which memory planning needs: the batch gets
    `ExecutorchConfig.max_batch_size`, sequence-like dims the model's position limit
    (`position_limit`; the encoder's sequence a decoder reads, the encoder's where the config names
    one), others twice the sample. `chosen` says what was picked and why."""

    def __init__(self, model: torch.nn.Module, inputs: dict[str, Any], config: ExecutorchConfig):
        model_config = getattr(model, "config", None)  # a projector or an lm_head component has none
        self.max_positions = _sequence_bound(model_config, config, POSITION_LIMITS)
        # without a limit in the config, the encoder's sequence keeps twice the sample: at the
        # fallback on both sides, a cross-attention planned 48 GiB (tests' `_CrossAttention`)
        self.max_encoder_positions = _sequence_bound(model_config, config, ENCODER_POSITION_LIMITS, fallback=False)
        self.max_batch = config.max_batch_size
        self.max_patches = config.max_image_patches
        self.static_cache = has_fixed_batch(inputs)
        self.cache_length = _static_cache_length(inputs)
        self.chosen: dict[str, str] = {}
        # an image-text model's `text_embeddings` component: its one input (`input`, unnamed by its
        # role) is token ids `[batch, sequence]`, bounded as the language model's sequence is
        self.token_ids = isinstance(model, torch.nn.Embedding)

    def __call__(self, name: str, axis: int, size: int, role: str | None) -> tuple[int, int]:
        """`(1, upper)` for axis `axis` of input leaf `name`, whose role the capture read (`capture.dynamic.Bounds`)."""
        if role is None and self.token_ids and axis < 2:
            role = ("batch", "sequence")[axis]
        if role == "cache_length" and self.static_cache:
            # planned at exactly the static cache's size: method_meta then gives the caller's
            # buffer sizes (examples/decode_loop_executorch.cpp allocates the cache from `nbytes()`)
            upper, why = size, "the static cache's max_cache_len"
        elif role == ATTENDED_ROLE and self.cache_length is not None:
            upper, why = self.cache_length, "the static cache's max_cache_len (a mask attends at most every slot)"
        elif role in ("batch", "images"):
            upper, why = self.max_batch, "ExecutorchConfig.max_batch_size"
        elif role == "patches":
            upper, why = self.max_patches, "ExecutorchConfig.max_image_patches"
        elif role in ("sequence", "decoder_sequence", "cache_length"):
            upper, why = self.max_positions
        elif role == "encoder_sequence" and self.max_encoder_positions:  # the encoder's output a decoder reads
            upper, why = self.max_encoder_positions
        else:
            # Memory planning sizes every intermediate for the bounds; an image side or a feature
            # axis at 4096 planned terabytes for a ViT's attention (measured: DINOv2, AST).
            upper, why = 2 * size, "twice the sample (pass dynamic_shapes for more)"
        upper = max(upper, size)
        self.chosen[f"{name}[{axis}] ({role or 'dim'})"] = f"<= {upper}: {why}"
        return 1, upper


def _sequence_bound(model_config: Any, config: ExecutorchConfig, attributes: tuple[str, ...], *,
                    fallback: bool = True) -> tuple[int, str] | None:
    """`(upper bound, why)` of a sequence: `ExecutorchConfig.max_sequence_length`, else the first
    of `attributes` in the model's config, else `FALLBACK_MAX` (None where not `fallback`)."""
    if config.max_sequence_length is not None:
        return config.max_sequence_length, "ExecutorchConfig.max_sequence_length"
    if positions := position_limit(model_config, attributes):
        return positions[0], f"the model config's {positions[1]}"
    if not fallback:
        return None
    return FALLBACK_MAX, f"no position limit in the config ({', '.join(attributes)}): {FALLBACK_MAX}"


def _static_cache_length(inputs: dict[str, Any]) -> int | None:
    """The length of the static cache among `inputs` (its key buffers'), or `None`."""
    for value in inputs.values():
        if is_static_cache(value):
            keys = [layer.keys for layer in value.layers if isinstance(getattr(layer, "keys", None), torch.Tensor)]
            if keys:
                return int(keys[0].shape[-2])
    return None


def _physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB" if size >= 2**30 else f"{size / 2**20:,.1f} MiB"


def _planned_bytes(program: Any) -> int:
    return sum(sum(plan.non_const_buffer_sizes) for plan in program.executorch_program.execution_plan)


def _check_plan_size(program: Any, captured: Capture, model: torch.nn.Module) -> None:
    """Refuse a program whose planned activations exceed this machine's memory; warn about one that
    fits here but is larger than a device may give (`LARGE_PLAN`).

    ExecuTorch allocates every intermediate at its upper bound when the program loads; a plan
    beyond physical memory would only fail there, as a bare `std::bad_alloc`. A symbolic size
    whose bound is taken from an unsimplified expression (`s * s // s` bounds to 4096 squared)
    can make one tensor alone terabytes (measured: BLOOM's attention view). Below that, the bounds
    may come from defaults the caller does not know about (T5, with no position limit in its config,
    plans its attention at 4096 tokens: 16.9 GiB for a 230 KB test model)."""
    planned = _planned_bytes(program)
    bounds = ", ".join(f"{sym} <= {vr.upper}" for sym, vr in captured.program.range_constraints.items())
    if planned <= _physical_memory():
        if planned > LARGE_PLAN and bounds:
            logger.warning("%s: ExecuTorch will allocate %s for intermediates when it loads this program "
                           "(planned at the dims' upper bounds: %s; the record's dim_bounds says where each comes "
                           "from); lower them with ExecutorchConfig(max_sequence_length=..., max_batch_size=...) "
                           "or dynamic_shapes", model_name(model), _gib(planned), bounds)
        return
    specs = [(spec.allocated_memory, node.name, list(spec.shape))
             for node in program.exported_program(program.hfexport_method).graph.nodes
             if (spec := node.meta.get("spec")) is not None and hasattr(spec, "allocated_memory")]
    size, name, shape = max(specs, default=(0, "?", []))
    raise ConversionError(
        f"ExecuTorch's memory plan needs {_gib(planned)} for activations (this machine has "
        f"{_gib(_physical_memory())}); the largest is {name} {shape} ({_gib(size)}), planned at the dims' upper "
        f"bounds ({bounds})",
        model=model_name(model),
        remedy="lower the bounds: ExecutorchConfig(max_sequence_length=..., max_batch_size=...) or "
        "dynamic_shapes={...: Dim(max=...)}, or export with dynamic=False (CLI: --max-sequence-length N, "
        "--max-batch-size N; for an LLM's generation export, --static-cache N, the program ExecuTorch's LLM "
        "runner runs, which plans its prompt at N tokens)",
    )


def kernel_libraries(artifact: Any) -> list[str]:
    """The op namespaces outside ExecuTorch's portable kernels the program calls (their libraries load
    with the runner: `runner.KERNEL_LIBRARIES`)."""
    from .runner import KERNEL_LIBRARIES

    names = {op.name.split("::")[0] for plan in artifact.executorch_program.execution_plan for op in plan.operators}
    return sorted(names & set(KERNEL_LIBRARIES))


def delegation_summary(artifact: Any, delegate: str) -> dict[str, int | str]:
    """How many graph nodes the delegate took and how many stayed on portable kernels."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    program = artifact.exported_program(getattr(artifact, "hfexport_method", "forward"))
    delegated = portable = delegates = 0
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if "executorch_call_delegate" in name:
            delegates += 1
        elif name != "getitem":
            portable += 1
    for _, module in program.graph_module.named_children():
        if isinstance(module, LoweredBackendModule):
            graph = module.original_module.graph_module.graph
            delegated += sum(1 for n in graph.nodes if n.op == "call_function" and "getitem" not in str(n.target))
    return {"delegate": delegate, "delegates": delegates, "delegated_nodes": delegated, "portable_nodes": portable}
