"""Registries and workarounds: key checks, loud failures, reversible patches, fix order, removal conditions."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.errors import CaptureError, RegistryError
from hfexport.registry import Registry, load_object
from hfexport.workarounds import (
    FX_NODE_FIXES,
    PATCHES,
    due_for_removal,
    ordered_fixes,
    register_fx_node_fix,
    register_patch,
)


class _Scale(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.relu(x) * 2


@pytest.fixture
def scratch_patch():
    names = []
    yield names
    for name in names:
        PATCHES.remove(name)


def test_unknown_backend_fails_at_registration():
    with pytest.raises(RegistryError, match="unknown export format 'tensorrt'.*dynamo"):
        register_patch("tensorrt", "torch.nn.functional.relu", reason="x")


def test_unresolvable_target_of_installed_package_fails_loudly():
    with pytest.raises(RegistryError, match="does not resolve"):
        @register_patch("dynamo", "torch.nn.functional.no_such_function", reason="x")
        def patch_torch_nothing(original):
            return original


def test_target_of_missing_package_is_registered_inactive(scratch_patch):
    @register_patch("dynamo", "surely_not_installed_pkg.mod.fn", reason="x")
    def patch_missing_pkg(original):
        return original

    scratch_patch.append("patch_missing_pkg")
    assert PATCHES.get("patch_missing_pkg").is_available is False


def test_duplicate_names_are_refused_unless_override():
    registry = Registry("thing")
    registry.add("a", 1)
    with pytest.raises(RegistryError, match="already registered"):
        registry.add("a", 2)
    registry.add("a", 3, override=True)
    assert registry.get("a") == 3


def test_patch_is_active_during_export_and_restored_after(scratch_patch):
    original = torch.nn.functional.relu
    seen = []

    @register_patch("dynamo", "torch.nn.functional.relu", reason="test: relu becomes abs",
                    upstream="none (test)", seen_with={"torch": "2.13.0"})
    def patch_torch_relu(original_relu):
        def relu(x, inplace=False):
            seen.append(True)
            return torch.abs(x)
        return relu

    scratch_patch.append("patch_torch_relu")
    x = torch.tensor([-1.0, 2.0])
    program = DynamoExporter().export(_Scale(), {"x": x}, config=DynamoConfig())
    assert seen, "the patch was not active while tracing"
    assert torch.nn.functional.relu is original
    assert torch.equal(program.module()(x=x), torch.tensor([2.0, 4.0]))  # traced with the patch: |x| * 2


def test_patch_is_restored_when_the_export_raises(scratch_patch):
    original = torch.nn.functional.relu

    @register_patch("dynamo", "torch.nn.functional.relu", reason="test: relu raises")
    def patch_torch_relu_raises(original_relu):
        def relu(x, inplace=False):
            raise RuntimeError("boom")
        return relu

    scratch_patch.append("patch_torch_relu_raises")
    model = _Scale().train()
    with pytest.raises(CaptureError, match="boom"):
        DynamoExporter().export(model, {"x": torch.ones(2)}, config=DynamoConfig())
    assert torch.nn.functional.relu is original
    assert model.training is True


def test_fix_order_is_the_exporters_tuple_then_names():
    calls = []
    names = ["fix_b_test", "fix_a_test", "fix_c_test"]
    for name in names:
        def fn(node, _name=name):
            calls.append(_name)
            return False
        fn.__name__ = name
        register_fx_node_fix("dynamo", reason="order test")(fn)
    try:
        ordered = [f.name for f in ordered_fixes(FX_NODE_FIXES, "dynamo", ("fix_c_test",))]
        assert ordered == ["fix_c_test", "fix_a_test", "fix_b_test"]
    finally:
        for name in names:
            FX_NODE_FIXES.remove(name)


def test_node_fix_rewrites_the_traced_graph():
    @register_fx_node_fix("dynamo", reason="test: multiply by 3 instead of 2")
    def fix_mul_test(node):
        if node.op == "call_function" and node.target == torch.ops.aten.mul.Tensor and node.args[1] == 2:
            node.args = (node.args[0], 3)
            return True
        return False

    try:
        program = DynamoExporter().export(_Scale(), {"x": torch.ones(2)}, config=DynamoConfig())
        assert torch.equal(program.module()(x=torch.ones(2)), torch.full((2,), 3.0))
        from hfexport import record_of

        assert record_of(program).details["fx_fixes"] == ["fix_mul_test"]
    finally:
        FX_NODE_FIXES.remove("fix_mul_test")


def test_a_subclass_defined_in_a_script_gets_its_formats_workarounds():
    """An exporter subclassed in a top-level script (`bench/executorch_memory.py` does) has no
    package of its own: the built-in workarounds of its format apply, loaded in one place."""
    from hfexport import DynamoExporter

    mine = type("StagedExporter", (DynamoExporter,), {"__module__": "script"})
    from hfexport.presets import build_preset

    model, inputs = build_preset("llama")
    program = mine().export(model, inputs, config=DynamoConfig(dynamic=True))
    from hfexport import record_of

    assert "patch_transformers_sdpa_with_mask" in record_of(program).details["patches"]


@pytest.mark.slow
def test_the_record_lists_only_the_patches_the_export_reached(dynamic_llama):
    """Every patch of a format is swapped in; the record names those whose targets ran (a Llama
    does not reach Qwen2-VL's or Swin's)."""
    from hfexport import record_of
    from tests.harness import require_backend

    require_backend("onnx")
    patches = record_of(dynamic_llama("onnx")[2]).details["patches"]
    assert "patch_transformers_sdpa_with_mask" in patches
    assert not [p for p in patches if "qwen2_vl" in p or "swin" in p]


def test_remove_when_is_a_requirement_a_program_checks(scratch_patch):
    with pytest.raises(RegistryError, match="not a requirement a program can check"):
        @register_patch("dynamo", "torch.nn.functional.relu", reason="x", remove_when="when upstream fixes it")
        def patch_prose(original):
            return original

    @register_patch("dynamo", "torch.nn.functional.relu", reason="x", remove_when="torch>=2.0")
    def patch_due(original):
        return original

    scratch_patch.append("patch_due")
    assert PATCHES.get("patch_due").is_due_for_removal and "patch_due" in [w.name for w in due_for_removal()]


def test_no_built_in_workaround_is_due_for_removal_with_the_tested_versions():
    """Lists the workarounds whose `remove_when` the installed versions meet: after an upgrade,
    try each without (its "still needed" test says whether it can go) and delete or re-date it."""
    from hfexport.builtins import load_workarounds

    load_workarounds()
    due = [f"{w.name} (remove_when {w.remove_when})" for w in due_for_removal()]
    assert not due, "workarounds due for removal: " + "; ".join(due)


def test_a_quantize_stage_patch_is_resolved_only_when_applied(scratch_patch):
    """Registering the quantizers' patches must not import their packages; a bad target still
    fails loudly, when the stage applies it."""
    from hfexport.workarounds import applied_patches

    @register_patch("dynamo", "torch.nn.functional.no_such_function", reason="x", stage="quantize")
    def patch_quantize_stage(original):
        return original

    scratch_patch.append("patch_quantize_stage")
    with pytest.raises(RegistryError, match="does not resolve"), applied_patches("dynamo", stage="quantize"):
        pass


def test_load_object_names_a_class_by_module_and_name():
    assert load_object("hfexport.registry:Registry") is Registry
    with pytest.raises(RegistryError, match="does not name an object"):
        load_object("hfexport.registry")


def test_an_export_loads_the_shared_workarounds_and_only_its_own_backends():
    """`load_workarounds(fmt)` skips the other backends' patch modules (importing ExecuTorch's for
    an ONNX export cost seconds): right only while a backend's module registers for itself alone."""
    import importlib

    from hfexport.builtins import WORKAROUND_MODULES, load_workarounds, workaround_modules
    from hfexport.workarounds import all_workarounds

    modules = workaround_modules("onnx")
    assert [m for m in modules if m.startswith("hfexport.backends.")] == ["hfexport.backends.onnx.patches"]
    assert [m for m in WORKAROUND_MODULES if not m.startswith("hfexport.backends.")] == \
        [m for m in modules if not m.startswith("hfexport.backends.")]
    assert workaround_modules() == WORKAROUND_MODULES
    load_workarounds()
    for module in (m for m in WORKAROUND_MODULES if m.startswith("hfexport.backends.")):
        owner = module.split(".")[2]
        defined = importlib.import_module(module)
        for workaround in all_workarounds():
            if getattr(defined, workaround.name, None) is not None:
                assert workaround.formats == (owner,), f"{workaround.name} of {module} serves {workaround.formats}"
