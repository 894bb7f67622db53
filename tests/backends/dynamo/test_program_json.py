"""What a `.pt2`'s program JSON may say (`backends/dynamo/program_json.py`, `tree_specs.py`): every
string torch resolves, evaluates or pastes into source is held to a rule, on real programs
tampered with as an attacker would."""

from __future__ import annotations

import contextlib
import json
import sys
import zipfile

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.backends.dynamo import tree_specs
from hfexport.backends.dynamo.artifact import read_program, write_program
from hfexport.errors import RuntimeLoadError
from hfexport.presets import build_preset
from tests.backends.dynamo.archives import cache_context_edited, program_edited, rewrite, state


def _refused(path, match: str) -> None:
    with pytest.raises(RuntimeLoadError, match=match) as refusal:
        read_program(path)
    assert str(refusal.value).count("\n") == 1


def _nodes(tree):
    return tree["graph_module"]["graph"]["nodes"]


def _signature(tree):
    return tree["graph_module"]["module_call_graph"][0]["signature"]


def _spec(tree, which="in_spec"):
    return json.loads(_signature(tree)[which])


def _set_spec(tree, spec, which="in_spec"):
    _signature(tree)[which] = json.dumps(spec)


def _kwargs_keys(context_change):
    """Edit the context (the keys) of the program's keyword-arguments dict spec."""
    def edit(tree):
        spec = _spec(tree)
        kwargs = spec[1]["children_spec"][1]
        kwargs["context"] = json.dumps(context_change(json.loads(kwargs["context"])))
        _set_spec(tree, spec)
    return edit


def _out_spec_type(name):
    def edit(tree):
        spec = _spec(tree, "out_spec")
        spec[1]["type"] = name
        _set_spec(tree, spec, "out_spec")
    return edit


def _output_fields(fields):
    def edit(tree):
        spec = _spec(tree, "out_spec")
        spec[1]["context"] = json.dumps(fields)
        _set_spec(tree, spec, "out_spec")
    return edit


def _set(path, value):
    """Set `tree[path...] = value` (a node index path into the program's first nodes)."""
    def edit(tree):
        node = tree
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _first_node(change):
    return lambda tree: change(_nodes(tree)[0])


def _first_input_spec(kind, value):
    def edit(tree):
        tree["graph_module"]["signature"]["input_specs"][0] = {kind: value}
    return edit


#: edit of a real program -> what the one-line refusal says
ATTACKS = {
    "target-getattr-chain": (_first_node(lambda n: n.update(target="torch.hub.load")), "is not an operator"),
    "target-other-namespace": (_first_node(lambda n: n.update(target="torch.ops.higher_order.run_const_graph")),
                               "is not an operator"),
    "target-namespace-attribute": (_first_node(lambda n: n.update(target="torch.ops.aten.__dict__.default")),
                                   "is not an operator"),
    "target-packet-attribute": (_first_node(lambda n: n.update(target="torch.ops.aten.add.op")), "is not an operator"),
    "target-extension": (_first_node(lambda n: n.update(target="#custom:op")), "is not an operator"),
    "target-python": (_first_node(lambda n: n.update(target="builtins.eval")), "is not an operator"),
    "node-name": (_first_node(lambda n: n.update(name="x = __import__('os')")), "is not a Python identifier"),
    "keyword-name": (_first_node(lambda n: n["inputs"][0].update(name="a=1, b")), "is not a Python identifier"),
    "parameter-name": (lambda tree: tree["graph_module"]["signature"]["input_specs"][0]["parameter"].update(
        parameter_name='model")or("x'), "is not a dotted name"),
    "forward-arg-name": (lambda tree: _signature(tree)["forward_arg_names"].__setitem__(0, "x=print()"),
                         "is not a Python identifier"),
    "source-fn-stack": (_first_node(lambda n: n["metadata"].update(source_fn_stack="linear,torch.nn.Linear")),
                        "source_fn_stack is node metadata hfexport never writes"),
    # torchao-quantized programs carry {"_torchdynamo_disable": true, ...}; FX prints it into a comment
    "custom-metadata-line": (_first_node(lambda n: n["metadata"].update(
        custom='{"note": "\\n__import__(\'os\').system(\'id\')"}')), "control characters"),
    "custom-metadata-list": (_first_node(lambda n: n["metadata"].update(custom="[1]")), "not a JSON object"),
    "stack-trace-carriage-return": (_first_node(lambda n: n["metadata"].update(stack_trace="File x\rimport os")),
                                    "stack_trace is not text without control characters"),
    "string-input": (lambda tree: tree["graph_module"]["graph"]["inputs"].__setitem__(0, {"as_string": "x'"}),
                     "an input that is not a tensor"),
    "constant-input-spec": (_first_input_spec("constant_input", {"name": "x", "value": {"as_string": "'"}}),
                            "of kind 'constant_input'"),
    "custom-object-spec": (_first_input_spec("custom_obj", {"arg": {"name": "x", "class_fqn": "os.system"},
                                                           "custom_obj_name": "x"}), "of kind 'custom_obj'"),
    "custom-object-values": (lambda tree: tree["graph_module"]["graph"]["custom_obj_values"].update(
        x={"name": "x", "class_fqn": "__torch__.x"}), "is not empty"),
    "graph-module-metadata": (lambda tree: tree["graph_module"]["metadata"].update(custom="{}"), "is not empty"),
    "unknown-field": (lambda tree: tree["graph_module"].update(code="import os"), "is not a field of torch's"),
    "device": (lambda tree: next(v for v in tree["graph_module"]["graph"]["tensor_values"].values())["device"].update(
        type="xla"), "is not one of cpu, cuda"),
    "verifier": (lambda tree: tree.update(verifiers=["EXPORT_IR"]), "is not one of ATEN, TRAINING"),
    "enum-import-in-spec": (_kwargs_keys(lambda keys: [{"__enum__": True, "fqn": "os:system", "name": "a"}] + keys[1:]),
                            "is not a list of plain keys"),
    "spec-type-not-allowed": (_out_spec_type("collections.namedtuple"), "names the type 'collections.namedtuple'"),
    "spec-type-unregistered": (_out_spec_type("os.system"), "names the type 'os.system'"),
    "output-field": (_output_fields(["logits", "__class__"]), "not its fields"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_program_json_naming_what_hfexport_never_writes_is_refused(saved_llama, tmp_path, attack):
    _, _, path = saved_llama
    edit, match = ATTACKS[attack]
    _refused(rewrite(path, tmp_path / "model.pt2", program_edited(edit)), f"refused to load model.pt2: .*{match}")


def test_a_tree_spec_enum_that_imports_a_module_is_refused_before_the_import(saved_llama, tmp_path, monkeypatch):
    """torch reads a dict spec's context with an object hook that imports the module an
    `__enum__` object names (`enum_object_hook`); the module below writes a marker when imported."""
    _, _, path = saved_llama
    module = f"hfx_enum_{tmp_path.name.replace('-', '_')}"
    marker = tmp_path / "imported"
    (tmp_path / f"{module}.py").write_text(f"open({str(marker)!r}, 'w')\nimport enum\nclass E(enum.Enum):\n    a = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    edit = _kwargs_keys(lambda keys: [{"__enum__": True, "fqn": f"{module}:E", "name": "a"}] + keys[1:])
    tampered = rewrite(path, tmp_path / "model.pt2", program_edited(edit))
    _refused(tampered, "is not a list of plain keys")
    assert not marker.exists() and module not in sys.modules
    with contextlib.suppress(Exception):  # the check can fail: torch.export.load imports it
        torch.export.load(tampered)
    assert marker.exists()
    sys.modules.pop(module, None)


#: edits of the cache context in a real decode program's input spec (`tests/capture/test_pytree.py`
#: tries more shapes on the context alone)
CACHE_ATTACKS = {
    "class-outside-the-table": (lambda t: t[2]["t"][0]["t"].__setitem__(0, {"class": "torch.nn:Module"}),
                                "'torch.nn:Module', which is not a cache class registered"),
    "dunder-attribute": (lambda t: t[2]["t"][0]["t"].__setitem__(2, state([("__class__", 1)])), "'__class__'"),
    "dtype-load": (lambda t: t[2]["t"][0]["t"].__setitem__(2, state([("dtype", {"dtype": "load"})])),
                   "'load', which is not a torch.dtype"),
}


@pytest.mark.parametrize("attack", list(CACHE_ATTACKS))
def test_a_cache_context_hfexport_never_writes_is_refused_by_its_loader(saved_decode, tmp_path, attack):
    edit, match = CACHE_ATTACKS[attack]
    read_program(saved_decode)  # the real one loads
    _refused(rewrite(saved_decode, tmp_path / "decode.pt2", cache_context_edited(edit)),
             f"refused to load decode.pt2: its models/model.json: .*in_spec: .*{match}")


@pytest.mark.parametrize(("module", "imported"), [
    ("transformers.modeling_outputs", True),
    ("transformers.cache_utils", True),
    ("transformers.models.llava.modeling_llava", True),
    ("transformers.models.qwen2_vl.modeling_qwen2_vl", True),
    ("transformers.models.not_a_model.modeling_not_a_model", False),
    ("transformers.models.llava.processing_llava", False),
    ("transformers.models.llava.modeling_gpt2", False),
    ("transformers.commands.chat", False),
    ("transformers.utils.hub", False),
    ("os", False),
])
def test_only_the_transformers_modules_the_rule_names_are_imported(monkeypatch, module, imported):
    calls = []
    monkeypatch.setattr(tree_specs.importlib, "import_module", calls.append)
    spec = json.dumps([1, {"type": f"{module}.SomeOutput", "context": "[]", "children_spec": []}])
    tree_specs.import_output_modules({"graph_module": {"module_call_graph": [{"signature": {"in_spec": spec}}]}})
    assert calls == ([module] if imported else [])


def test_real_programs_of_every_kind_pass(saved_generation, saved_llama):
    """A program without example inputs (the encoder-decoder's decoder), one over a static cache, one
    over a DynamicCache, a plain one: the rules accept what hfexport writes."""
    paths = [saved_llama[2], *(saved_generation("dynamo", case).directory / name
                               for case, name in [("llama", "decode.pt2"), ("llama", "prefill.pt2"),
                                                  ("llama-static", "decode.pt2"), ("t5", "encoder.pt2"),
                                                  ("t5", "decode.pt2")])]
    for path in paths:
        assert isinstance(read_program(path), torch.export.ExportedProgram), path


@pytest.mark.parametrize(("name", "dynamic", "part"), [
    ("mamba", False, "transformers.cache_utils:LinearAttentionLayer"),  # an SSM cache layer in the outputs
    ("llava", False, "torch.sym_ite"),
    ("dinov2", True, "_operator.pow"),
])
def test_programs_with_rarer_parts_pass(tmp_path, name, dynamic, part):
    """Found by exporting every preset: the layer classes of `LinearAttentionCacheLayerMixin`, and
    size functions beyond arithmetic, are what hfexport writes too."""
    model, inputs = build_preset(name)
    program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=dynamic))
    path = write_program(program, tmp_path / "model.pt2")
    with zipfile.ZipFile(path) as archive:
        assert part in archive.read("model/models/model.json").decode()
    assert isinstance(read_program(path), torch.export.ExportedProgram)


def test_the_size_functions_are_torch_s_own():
    """The table is written out; this fails the day torch serializes another set."""
    from torch._export.serde.serialize import _SYM_OPS, GraphModuleSerializer

    from hfexport.backends.dynamo.program_json import _SIZE_OPERATORS

    serializer = GraphModuleSerializer.__new__(GraphModuleSerializer)  # serialize_operator reads no state
    assert _SIZE_OPERATORS == {serializer.serialize_operator(op) for op in _SYM_OPS}


def test_a_pt2e_int8_program_passes(tmp_path):
    """`--quantize int8-dynamic` on dynamo writes the quantize/dequantize ops of
    `torch.ops.quantized_decomposed`: a namespace hfexport's programs use."""
    from hfexport.cli.main import main

    folder = tmp_path / "q"
    assert main(["export", "tiny:llama", "-f", "dynamo", "--task", "forward", "--quantize", "int8-dynamic",
                 "--no-validate", "--quiet", "-o", str(folder)]) == 0
    with zipfile.ZipFile(folder / "model.pt2") as archive:
        assert "torch.ops.quantized_decomposed." in archive.read("model/models/model.json").decode()
    assert isinstance(read_program(folder / "model.pt2"), torch.export.ExportedProgram)
