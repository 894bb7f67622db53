"""The registry: key checks, loud failures, reversible patches, fix order."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.errors import CaptureError, RegistryError
from hfexport.registry import (
    FX_NODE_FIXES,
    PATCHES,
    Registry,
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
    with pytest.raises(RegistryError, match="unknown backend 'tensorrt'.*dynamo"):
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


def test_a_subclass_defined_in_a_script_loads_its_base_backends_patches(monkeypatch):
    """An exporter subclassed in a top-level script (`bench/executorch_memory.py` does) has no
    package of its own: the backend patches come from the nearest base class that has them."""
    import importlib

    from hfexport import ExecutorchExporter

    imported = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *args: imported.append(name) or real(name, *args))
    mine = type("StagedExporter", (ExecutorchExporter,), {"__module__": "script"})
    mine()._load_workarounds()
    assert imported == ["hfexport.backends.executorch.patches", "hfexport.models"]
