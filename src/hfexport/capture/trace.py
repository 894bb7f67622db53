"""Steps 2 and 3, capture and check: one `torch.export` trace shared by every backend, the check
that it kept every axis asked to be dynamic, then the FX fixes.

A fix to tracing here helps all four backends at once.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import CaptureError, summarize
from ..workarounds import FX_NODE_FIXES, FX_PROGRAM_FIXES, FxFix, ordered_fixes
from .dynamic import grow_batch, plan_dynamic_shapes, size_oblivious_tracing
from .interface import named_kwargs_forward, split_constants
from .names import CACHE_PREFIX
from .prepare import model_name
from .pytree import register_cache_pytree_nodes

__all__ = ["capture", "apply_fx_fixes", "reexport", "Capture", "AxesLost", "check_dynamic_axes"]

logger = logging.getLogger("hfexport")


@dataclasses.dataclass
class Capture:
    """What the capture step produced: the program and how it was traced."""

    program: torch.export.ExportedProgram
    size_oblivious: bool
    fixes_applied: list[str]
    #: what the check step found fixed but allowed (`check_dynamic_axes`), for the record
    fixed_axes: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the inputs the program was traced with (the caller's, or their batch grown to 2)
    sample: dict[str, Any] | None = None
    #: patches of a later stage (quantization) that the export reached, for the record
    patches_reached: list[str] = dataclasses.field(default_factory=list)
    #: whether the decoder's layers were stamped from a two-layer trace, or why not (`stamp.py`)
    layer_stamping: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: where they were: the program of fewer layers on request (a converter that stamps its own graph)
    stamped_layers: StampedLayers | None = None


@dataclasses.dataclass
class StampedLayers:
    """A stamped capture's two-layer program, from which a program of its first layers is stamped."""

    shallow: torch.export.ExportedProgram
    model: torch.nn.Module
    stack: Any  # stamp.LayerStack
    backend: str
    fix_order: tuple[str, ...]

    @property
    def count(self) -> int:
        """The model's layers (the whole capture's)."""
        return len(self.stack.layers)

    def program(self, layers: int) -> torch.export.ExportedProgram:
        """The program of the model's first `layers` layers (the later layers' caches pass through),
        with the backend's FX fixes applied as to the whole capture's.

        Raises:
            NotStampable: as `stamp.stamp`.
        """
        from .stamp import stamp

        program = stamp(self.shallow, self.model, self.stack, layers)
        apply_fx_fixes(program, self.backend, self.fix_order)
        return program


def _user_frame(error: BaseException) -> str | None:
    """The deepest traceback frame outside torch: the model line that triggered `error`."""
    frames = []
    current: BaseException | None = error
    while current is not None:
        frames.extend(traceback.extract_tb(current.__traceback__))
        current = current.__cause__ or current.__context__
    for frame in reversed(frames):
        if "/torch/" not in frame.filename and "/hfexport/" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} ({frame.name}): {frame.line}"
    return None


def _translate(error: Exception, model: Any, config: Any, *, size_oblivious: bool = False) -> CaptureError:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    name = model_name(model)
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    where = _user_frame(error)
    at = f" at {where}" if where else ""
    text = str(error)
    if isinstance(error, GuardOnDataDependentSymNode) or "data-dependent" in text or "data dependent" in text:
        return CaptureError(
            f"torch.export hit a data-dependent shape{at}: {first}",
            model=name,
            remedy="pass prefer_deferred_runtime_asserts_over_guards=True in the config; if that is not enough, "
            "add torch._check(...) on the size at that line, or export with static shapes",
        )
    if "Constraints violated" in text or "specialized" in text or "specialised" in text:
        return CaptureError(
            f"a dimension you marked dynamic cannot be dynamic{at}: {first}",
            model=name,
            remedy="use dynamic=True (Dim.AUTO infers the relations), widen the Dim(min=, max=) bounds, "
            "or make that dimension static; add prefer_deferred_runtime_asserts_over_guards=True for range guards",
        )
    if size_oblivious:
        return CaptureError(
            f"torch.export failed{at} while keeping size-1 dimensions dynamic: {summarize(error)}",
            model=name,
            remedy="trace with sample inputs whose dynamic sizes are not 1 (e.g. batch 2), or pass "
            "allow_size_one_specialization=True to retry with torch.export's default, which fixes every "
            "size-1 dimension (listed in the record)",
        )
    return CaptureError(
        f"torch.export failed{at}: {summarize(error)}",
        model=name,
        remedy="rerun with --debug (CLI) or logging at DEBUG for the full trace, and report it with the model class "
        "and versions (`hfexport env`)",
    )


def _export(model, inputs, dynamic_shapes, config, *, size_oblivious: bool,
            drop_none: bool = False) -> torch.export.ExportedProgram:
    traced, constants = split_constants(inputs)
    if isinstance(dynamic_shapes, dict):
        dynamic_shapes = {k: v for k, v in dynamic_shapes.items() if k in traced}
    with size_oblivious_tracing(size_oblivious), named_kwargs_forward(model, list(traced), constants, drop_none=drop_none):
        return torch.export.export(
            model,
            (),
            kwargs=traced,
            dynamic_shapes=dynamic_shapes,
            strict=config.strict,
            prefer_deferred_runtime_asserts_over_guards=config.prefer_deferred_runtime_asserts_over_guards,
        )


def capture(model: torch.nn.Module, inputs: dict[str, Any], config: Any, *, backend: str,
            fix_order: tuple[str, ...] = (), bounds: Any = None, drop_none_outputs: bool = False,
            functionalize: Callable[[torch.export.ExportedProgram, bool], torch.export.ExportedProgram] | None = None,
            stamp_layers: bool = False) -> Capture:
    """Trace `model(**inputs)` with `torch.export` under `config`'s shape plan, check that the
    program kept every axis the plan asked to be dynamic, then apply the FX fixes registered for
    `backend` (those named in `fix_order` first, in that order). `bounds` gives `dynamic=True`
    dimensions a range (see `plan_dynamic_shapes`). A program that writes its inputs in place is
    functionalized by `functionalize(program, size_oblivious)` (default `functionalized`), before
    the FX fixes.

    With `stamp_layers`, a decoder whose layers differ only in their weights is traced with two
    layers and the second stamped for the rest (`stamp.py`); where it cannot be, the whole model is
    traced, and `Capture.layer_stamping` says why either way.

    Raises:
        CaptureError: with the model line that failed and what to try; or naming each axis asked
            to be dynamic that the program fixed (`check_dynamic_axes`).
    """
    register_cache_pytree_nodes(inputs)
    captured, stamping = (_stamped(model, inputs, config, bounds, drop_none_outputs, functionalize,
                                   backend=backend, fix_order=fix_order)
                          if stamp_layers else (None, {}))
    if captured is None:
        captured = _captured(model, inputs, config, bounds, drop_none_outputs, functionalize)
    captured.layer_stamping = stamping
    captured.fixes_applied = apply_fx_fixes(captured.program, backend, fix_order)
    return captured


def _stamped(model: torch.nn.Module, inputs: dict[str, Any], config: Any, bounds: Any, drop_none_outputs: bool,
             functionalize: Any, *, backend: str, fix_order: tuple[str, ...]) -> tuple[Capture | None, dict[str, Any]]:
    """`(the capture of model's first two layers with the second stamped for the rest, the
    record's entry)`, or `(None, why not)` where the whole model is to be traced (`stamp.py`)."""
    from .stamp import NotStampable, shallow, stamp, stampable

    stack, why = stampable(model, config, inputs, backend)
    if stack is None:
        return None, {"not_stamped": why}
    try:
        captured = _captured(shallow(model, stack), inputs, config, bounds, drop_none_outputs, functionalize)
        two_layers = captured.program
        captured.program = stamp(two_layers, model, stack)
        captured.stamped_layers = StampedLayers(two_layers, model, stack, backend, fix_order)
    except (NotStampable, CaptureError) as error:  # the whole trace decides (its error, if any)
        why = str(error).splitlines()[0]
        logger.info("%s: layers not stamped, the whole model traced: %s", model_name(model), why)
        return None, {"not_stamped": why}
    except Exception as error:  # noqa: BLE001 - a stamp bug costs the whole trace's time, not the export
        why = f"the stamp failed ({type(error).__name__}: {summarize(error, 200)}): please report it"
        logger.warning("%s: layers not stamped, the whole model traced: %s", model_name(model), why)
        return None, {"not_stamped": why}
    last = len(stack.layers) - 1
    layers = "layer 2" if last == 2 else f"layers 2-{last}"
    return captured, {"stamped": f"{layers} of {stack.path}, from layer 1 of a two-layer trace"}


def _captured(model: torch.nn.Module, inputs: dict[str, Any], config: Any, bounds: Any, drop_none_outputs: bool,
              functionalize: Callable[[torch.export.ExportedProgram, bool], torch.export.ExportedProgram] | None,
              ) -> Capture:
    """`capture`'s trace and check, functionalized, before the FX fixes."""
    try:
        program, size_oblivious, fixed = _traced_and_checked(model, inputs, config, bounds, drop_none_outputs)
        sample = inputs
    except AxesLost as error:
        # A batch traced at 1 can come out fixed, or bounded to 1..2, where the trace guards on
        # the size being 1 (a reshape's view-or-copy choice; models/batched_matmul.py patches the
        # common ones). Traced at 2, the program is kept only if it still takes a batch of 1 (no
        # guard `batch != 1`); any other lost axis is the caller's to decide.
        sample = grow_batch(inputs) if all(e["role"] == "batch" and e["size"] == 1 for e in error.axes) else None
        if sample is None or _shapes_of(sample) == _shapes_of(inputs):
            raise
        logger.info("%s: the batch traced at 1 came out fixed; traced again at batch 2", model_name(model))
        try:
            program, size_oblivious, fixed = _traced_and_checked(model, sample, config, bounds, drop_none_outputs)
        except CaptureError:
            raise error from None
        if not _takes_batch_one(program, sample):
            raise error from None  # traced at 2 it guards on the batch not being 1: no better
        fixed["traced_batch"] = 2
    if mutates_user_inputs(program):
        program = (functionalize or functionalized)(program, size_oblivious)
    return Capture(program, size_oblivious, [], fixed, sample)


def _takes_batch_one(program: torch.export.ExportedProgram, sample: dict[str, Any]) -> bool:
    """Whether `program`, traced on `sample`, admits a batch of 1: every batch symbol's range
    starts at 1 or below, and no runtime assert of the graph fails with the batch at 1 and every
    other size at the sample's (traced at 2, a guard `batch != 1` is such an assert)."""
    import sympy

    from .record import record_from_program
    from .names import role_of

    record = record_from_program(program)
    values: dict[str, int] = {}
    batch: set[str] = set()
    tensors = [leaf for leaf in pytree.tree_leaves(split_constants(sample)[0]) if isinstance(leaf, torch.Tensor)]
    for name, shape, tensor in zip(record.input_names, record.input_shapes, tensors):
        for axis, (dim, size) in enumerate(zip(shape, tensor.shape)):
            if isinstance(dim, str) and dim.isidentifier():
                values[dim] = int(size)
                if role_of(name, len(shape), axis) == "batch":
                    batch.add(dim)
    if any(record.symbol_ranges.get(symbol, (0, None))[0] > 1 for symbol in batch):
        return False
    ranks = {name: len(shape) for name, shape in zip(record.input_names, record.input_shapes)}
    # Guards the program checks on its inputs (`ExportedProgram._guards_code`, read from torch 2.13):
    # `L['input_ids'].size()[0] != 1`, `L['past_key_values']['0.conv_states.0'].size()[0] != 1`.
    for guard in getattr(program, "_guards_code", None) or []:
        for top, leaf, axis in re.findall(r"L\['([^']+)'\](?:\['([^']+)'\])?\.size\(\)\[(\d+)\] (?:!= 1|>= 2|> 1)", guard):
            name = f"{CACHE_PREFIX}.{leaf}" if leaf else top
            if role_of(name, ranks.get(name, int(axis) + 1), int(axis)) == "batch":
                return False
    at_one = {sympy.Symbol(k): (1 if k in batch else v) for k, v in values.items()}
    for node in program.graph.nodes:
        if node.target is not torch.ops.aten._assert_scalar.default or len(node.args) < 2:
            continue
        found = re.search(r"expression (.+?) on node", str(node.args[1]))
        try:
            holds = sympy.sympify(found.group(1), locals={str(k): k for k in at_one}).subs(at_one) if found else True
        except (sympy.SympifyError, TypeError, ValueError):
            continue
        if holds is sympy.false or holds is False:
            return False
    return True


def _shapes_of(inputs: dict[str, Any]) -> list[tuple[int, ...]]:
    return [tuple(leaf.shape) for leaf in pytree.tree_leaves(inputs) if isinstance(leaf, torch.Tensor)]


def _traced_and_checked(model, inputs, config, bounds, drop_none: bool):
    """`(program, size_oblivious, fixed axes)`: steps 2 and 3 on one sample."""
    dynamic_shapes = plan_dynamic_shapes(inputs, dynamic=config.dynamic, dynamic_shapes=config.dynamic_shapes,
                                         bounds=bounds)
    # Size-oblivious tracing only matters where every dim is dynamic (explicit Dims say their own min).
    size_oblivious = config.dynamic and config.dynamic_shapes is None
    fallback: str | None = None
    try:
        program = _export(model, inputs, dynamic_shapes, config, size_oblivious=size_oblivious, drop_none=drop_none)
    except Exception as first_error:  # noqa: BLE001 - retried only when the caller allowed it, else translated
        if not (size_oblivious and getattr(config, "allow_size_one_specialization", False)):
            raise _translate(first_error, model, config, size_oblivious=size_oblivious) from first_error
        fallback = summarize(first_error, 300)
        size_oblivious = False
        try:
            program = _export(model, inputs, dynamic_shapes, config, size_oblivious=False, drop_none=drop_none)
        except Exception as error:  # noqa: BLE001
            raise _translate(error, model, config) from error
    fixed = check_dynamic_axes(program, model, inputs, dynamic_shapes, config, fallback=fallback)
    return program, size_oblivious, fixed


class AxesLost(CaptureError):
    """The program fixed axes asked to be dynamic; `axes` lists them (see `dynamic.lost_axes`)."""

    def __init__(self, message: str, axes: list[dict[str, Any]], **kwargs: Any):
        super().__init__(message, **kwargs)
        self.axes = axes


def check_dynamic_axes(program: torch.export.ExportedProgram, model: Any, inputs: dict[str, Any], plan: Any,
                       config: Any, *, fallback: str | None = None) -> dict[str, Any]:
    """Step 3, check: raise `CaptureError` when the program fixed an axis the plan asked to be
    dynamic (see `dynamic.lost_axes`); return what the record says about fixed axes.

    With `allow_size_one_specialization`, axes whose sample size is 1 may come out fixed or
    narrowed (after a capture that fell back to torch.export's default, `fallback` says why
    size-oblivious tracing failed); they are returned under `"specialized_size_one"`. Axes the model's weights or config fix
    (no token role) are returned under `"fixed_by_model"`.
    """
    from .record import record_from_program
    from .dynamic import describe_axes, lost_axes

    if plan is None:
        return {}
    names = record_from_program(program).input_names
    lost, by_model = lost_axes(program, split_constants(inputs)[0], plan, names)
    out: dict[str, Any] = {"fixed_by_model": by_model} if by_model else {}
    if getattr(config, "allow_size_one_specialization", False):
        allowed = [e for e in lost if e["size"] == 1]
        lost = [e for e in lost if e not in allowed]
        out["specialized_size_one"] = allowed
        if fallback is not None:
            out["size_oblivious_failure"] = fallback
        if allowed:
            logger.info("%s: allow_size_one_specialization fixed %s", model_name(model), describe_axes(allowed))
    if lost:
        first = next((e for e in lost if "range" not in e), lost[0])  # a fixed axis has a guard to name
        cause = _why_fixed(model, inputs, plan, config, first, size_oblivious=fallback is None)
        raise AxesLost(
            f"the program fixed {len(lost)} ax{'is' if len(lost) == 1 else 'es'} asked to be dynamic: "
            f"{describe_axes(lost)}" + (f". torch.export says: {cause}" if cause else ""), lost,
            model=model_name(model),
            remedy="if the model's code fixes the axis (a Python loop over it, a reshape to a constant), "
            "export with dynamic_shapes that leave it static; if the sample fixed "
            "it (a size of 1, or equal to another size), trace with other sample sizes (e.g. batch 2, sequence 7)",
        )
    return out


def _why_fixed(model: Any, inputs: dict[str, Any], plan: Any, config: Any, axis: dict[str, Any], *,
               size_oblivious: bool) -> str | None:
    """torch.export's own account of why `axis` was fixed: the same export with that one axis a
    `Dim.DYNAMIC`, which torch.export refuses to specialise silently (it names the guard)."""
    from .dynamic import mark_dynamic

    strict_plan = mark_dynamic(split_constants(inputs)[0], plan, axis["leaf"], axis["axis"])
    if strict_plan is None:
        return None
    try:
        _export(model, inputs, strict_plan, config, size_oblivious=size_oblivious)
    except Exception as error:  # noqa: BLE001 - its message is the explanation we want
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        useful = [line for line in lines if "specializ" in line or "guard" in line.lower() or "Not all values" in line]
        return " ".join((useful or lines)[:3])[:600] or type(error).__name__
    return None


def reexport(module: torch.nn.Module, inputs: dict[str, Any], config: Any, *, bounds: Any = None,
             size_oblivious: bool) -> torch.export.ExportedProgram:
    """Export `module` (a transformed `program.module()`, e.g. after quantization) again, with
    the same inputs and dynamic-shapes plan as the first capture."""
    traced, _ = split_constants(inputs)
    plan = plan_dynamic_shapes(traced, dynamic=config.dynamic, dynamic_shapes=config.dynamic_shapes, bounds=bounds)
    with size_oblivious_tracing(size_oblivious):
        program = torch.export.export(
            module, (), kwargs=traced, dynamic_shapes=plan, strict=False,
            prefer_deferred_runtime_asserts_over_guards=config.prefer_deferred_runtime_asserts_over_guards,
        )
    if mutates_user_inputs(program):
        program = functionalized(program, size_oblivious)
    return program


def mutates_user_inputs(program: torch.export.ExportedProgram) -> bool:
    """Whether the graph writes into a user input in place (a static cache's `index_copy_`)."""
    user_inputs = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if target._schema.is_mutable and node.args and getattr(node.args[0], "name", None) in user_inputs:
            return True
    return False


def functionalized(program: torch.export.ExportedProgram, size_oblivious: bool) -> torch.export.ExportedProgram:
    """`program` with its in-place writes to user inputs lifted into `USER_INPUT_MUTATION` outputs.

    # NOTE: torch.export's default IR keeps `index_copy_`/`add_` on the cache tensors as graph ops;
    # only a functional graph states the write in its signature (the Dynamo program models
    # the cache update as a `USER_INPUT_MUTATION`, and ExecuTorch's method outputs carry the
    # mutated tensors). An empty decomposition table functionalizes without decomposing anything.
    """
    with size_oblivious_tracing(size_oblivious):
        return program.run_decompositions({})


def _run_node_fix(program: torch.export.ExportedProgram, fix: FxFix) -> bool:
    changed = False
    for node in list(program.graph_module.graph.nodes):
        changed |= bool(fix.fn(node))
    return changed


def apply_fx_fixes(program: torch.export.ExportedProgram, backend: str, order: tuple[str, ...] = ()) -> list[str]:
    """Apply program fixes, then node fixes, registered for `backend`; return the names that changed the graph."""
    applied = []
    for fix in ordered_fixes(FX_PROGRAM_FIXES, backend, order):
        if fix.fn(program):
            applied.append(fix.name)
    node_fixes = ordered_fixes(FX_NODE_FIXES, backend, order)
    for fix in node_fixes:
        if _run_node_fix(program, fix):
            applied.append(fix.name)
    if applied:
        program.graph_module.graph.eliminate_dead_code()
        program.graph_module.recompile()
        logger.debug("FX fixes applied for %s: %s", backend, ", ".join(applied))
    return applied
