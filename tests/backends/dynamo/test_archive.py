"""`check_archive`: hfexport's load of a `.pt2` refuses a file whose loading would run code it
carries (a pickled global, a symbolic size's expression that `sympify` evaluates), before
`torch.export.load` runs it; its own programs still load and match eager."""

from __future__ import annotations

import contextlib
import io
import json
import os
import zipfile

import pytest
import torch

from hfexport import DynamoExporter
from hfexport.backends.dynamo.artifact import write_program
from hfexport.errors import RuntimeLoadError


class _MakesDirectory:
    """Pickles as a call of `os.makedirs(path)`: what a hostile file does when unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.makedirs, (self.path,)


@pytest.fixture(scope="module")
def saved_llama(dynamic_llama, tmp_path_factory):
    """`(model, inputs, path)`: the tiny Llama's dynamic `torch.export` program, saved as hfexport saves it."""
    model, inputs, program = dynamic_llama("dynamo")
    path = write_program(program, tmp_path_factory.mktemp("archive") / "model.pt2")
    return model, inputs, path


def _tampered(source, target, change):
    """Copy the archive `source` to `target`, each member's bytes passed through `change(name, data)`."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for item in old.infolist():
            new.writestr(item, change(item.filename.split("/", 1)[1], old.read(item)))
    return target


def _pickled_example_inputs(marker):
    def change(name, data):
        if name != "data/sample_inputs/model.pt":
            return data
        buffer = io.BytesIO()
        torch.save((_MakesDirectory(marker), {}), buffer)
        return buffer.getvalue()
    return change


def _pickled_weight(marker):
    def change(name, data):
        if name == "data/weights/model_weights_config.json":
            config = json.loads(data)
            first = next(entry for entry in config["config"].values() if entry["path_name"] == "weight_0")
            first["use_pickle"] = True
            return json.dumps(config).encode()
        if name == "data/weights/weight_0":
            buffer = io.BytesIO()
            torch.save(_MakesDirectory(marker), buffer)
            return buffer.getvalue()
        return data
    return change


def _evaluated_expression(marker):
    def change(name, data):
        if name != "models/model.json":
            return data
        text = data.decode()
        first = text.index('"expr_str": "') + len('"expr_str": "')
        end = text.index('"', first)
        return (text[:first] + f"__import__('os').makedirs('{marker}')" + text[end:]).encode()
    return change


TAMPERINGS = {"example-inputs-pickle": _pickled_example_inputs, "weight-pickle": _pickled_weight,
              "size-expression": _evaluated_expression}


def test_hfexport_loads_its_own_program_and_it_matches_eager(saved_llama):
    model, inputs, path = saved_llama
    loaded = DynamoExporter().load([path])
    with torch.no_grad():
        expected = model(**inputs).logits
    assert (loaded.module()(**inputs).logits - expected).abs().max() < 1e-5


@pytest.mark.parametrize("tampering", list(TAMPERINGS))
def test_a_program_whose_loading_runs_code_is_refused_before_it_runs(saved_llama, tmp_path, tampering):
    _, _, path = saved_llama
    marker = tmp_path / "ran"
    tampered = _tampered(path, tmp_path / "model.pt2", TAMPERINGS[tampering](marker))
    with pytest.raises(RuntimeLoadError, match="refused to load model.pt2"):
        DynamoExporter().load([tampered])
    assert not marker.exists()
    # the check can fail: torch.export.load itself runs it
    with contextlib.suppress(Exception):
        torch.export.load(tampered)
    assert marker.exists()
