"""`check_archive`: hfexport's load of a `.pt2` refuses a file whose loading would run code it
carries (a pickled global, a symbolic size's expression that `sympify` evaluates), before
`torch.export.load` runs it; its own programs still load and match eager."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hfexport import DynamoExporter
from hfexport.backends.dynamo.artifact import read_program
from hfexport.errors import RuntimeLoadError
from tests.backends.dynamo.archives import (Touches, added, first_expression, pickled, program_edited, renamed, replaced,
                                            rewrite, touch_expression)


class _MakesDirectory:
    """Pickles as a call of `os.makedirs(path)`: what a hostile file does when unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.makedirs, (self.path,)


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


# -- the reader accepts only what hfexport writes (issue 49) ---------------------------------------


def _refused(path, match: str) -> None:
    with pytest.raises(RuntimeLoadError, match=match) as refusal:
        read_program(path)
    assert str(refusal.value).count("\n") == 1  # one line, then the remedy


def _runs_in_plain_torch(path, marker) -> None:
    """The check can fail: a plain `torch.export.load` of the same file (and a run of the program
    it loads) creates `marker`."""
    with contextlib.suppress(Exception):
        program = torch.export.load(path)
        args, kwargs = program.example_inputs
        program.module()(*args, **kwargs)
    assert marker.exists()
    marker.unlink()


def _touching_program(marker):
    def edit(tree):
        first_expression(tree)["expr_str"] = touch_expression(marker)
    return edit


@pytest.mark.parametrize("beside", [False, True], ids=["instead", "beside"])
def test_an_upper_case_program_member_is_refused_before_its_expression_runs(saved_llama, tmp_path, beside):
    """torch's reader finds `models/model.JSON` as `models/model.json` (miniz ignores case) and
    `torch.export.load` deserializes every member under `models/`; the old check skipped it."""
    _, _, path = saved_llama
    marker = tmp_path / "ran"
    with zipfile.ZipFile(path) as archive:
        root = archive.namelist()[0].split("/")[0]
        program = json.loads(archive.read(f"{root}/models/model.json"))
    _touching_program(marker)(program)
    # beside: right after the real one, where miniz's case-blind search (torch 2.13) finds it for both names
    data = json.dumps(program).encode()
    change = (added("models/model.JSON", data, after="models/model.json") if beside
              else renamed("models/model.json", "models/model.JSON", data))
    tampered = rewrite(path, tmp_path / "model.pt2", change)
    _refused(tampered, "refused to load model.pt2: its member 'models/model.JSON' is not one that torch.export.save "
                       "writes" if not beside else "'models/model.json' and 'models/model.JSON' are one name")
    assert not marker.exists()
    _runs_in_plain_torch(tampered, marker)


def test_an_upper_case_example_inputs_pickle_is_refused_before_it_runs(saved_llama, tmp_path):
    _, _, path = saved_llama
    marker = tmp_path / "ran"
    tampered = rewrite(path, tmp_path / "model.pt2",
                       renamed("data/sample_inputs/model.pt", "DATA/sample_inputs/model.pt", pickled(Touches(marker))))
    _refused(tampered, "its member 'DATA/sample_inputs/model.pt' is not one")
    assert not marker.exists()
    _runs_in_plain_torch(tampered, marker)


@pytest.mark.parametrize(("change", "match"), [
    (added("extra/notes.txt", b"hello"), "'extra/notes.txt' is not one"),
    (added("data/aotinductor/model/model.so", b"\x7fELF"), "'data/aotinductor/model/model.so' is not one"),
    (added("data/weights/model.pt", b""), "'data/weights/model.pt' is not one"),  # the layout of torch < 2.8
    (added("data/constants/opaque_obj_0", b""), "'data/constants/opaque_obj_0' is not one"),
    (added("data/weights/weight_01", b""), "'data/weights/weight_01' is not one"),
    (added("./models/model.json", b"{}"), "'./models/model.json' is not one"),
    (added("models\\model.json", b"{}"), "is not one"),
    (added("models/model.json", b"{}"), "'models/model.json' and 'models/model.json' are one name"),
    (added("data/weights/weight_999", b"\0" * 4), "'data/weights/weight_999' is named by no entry"),
    (lambda members: [m for m in members if m[0] != "archive_version"], "has no 'archive_version'"),
    (replaced("archive_version", b"1"), "its archive_version holds b'1'"),
], ids=["extra", "aotinductor", "old-layout", "opaque", "leading-zero", "dot-slash", "backslash", "duplicate",
        "unnamed-weight", "no-version", "version"])
def test_a_member_hfexport_does_not_write_is_refused(saved_llama, tmp_path, change, match):
    _, _, path = saved_llama
    _refused(rewrite(path, tmp_path / "model.pt2", change), match)


def test_a_compressed_member_is_refused_before_it_is_unpacked(saved_llama, tmp_path):
    """torch.export.save stores every member as is: a deflated one (a zip bomb's 4 GiB of zeros in a
    few MiB, here a model.json padded with spaces) is not what hfexport wrote, and is refused from
    the archive's directory, before any member is read."""
    _, _, path = saved_llama
    tampered = tmp_path / "model.pt2"
    with zipfile.ZipFile(path) as old, zipfile.ZipFile(tampered, "w") as new:
        for item in old.infolist():
            data = old.read(item)
            if item.filename.endswith("models/model.json"):
                item.compress_type, data = zipfile.ZIP_DEFLATED, data + b" " * 2**20
            new.writestr(item, data)
    assert tampered.stat().st_size < 2**20
    _refused(tampered, "its member '[^']*models/model.json' is compressed")


def test_a_member_outside_the_root_folder_is_refused(saved_llama, tmp_path):
    _, _, path = saved_llama
    tampered = rewrite(path, tmp_path / "model.pt2", lambda members: members)
    with zipfile.ZipFile(tampered, "a") as archive:
        archive.writestr("other/models/model.json", b"{}")
    _refused(tampered, "its member 'other/models/model.json' is outside the archive's root folder")


@pytest.mark.parametrize("entry", [{"use_pickle": True}, {"path_name": "opaque_obj_0"},
                                   {"path_name": "custom_obj_0"}, {"path_name": "../weights/weight_0"}])
def test_a_payload_config_naming_anything_but_a_raw_tensor_is_refused(saved_llama, tmp_path, entry):
    _, _, path = saved_llama

    def edit(tree):
        next(iter(tree["config"].values())).update(entry)

    tampered = rewrite(path, tmp_path / "model.pt2", program_edited(edit, "data/weights/model_weights_config.json"))
    _refused(tampered, "marked use_pickle" if "use_pickle" in entry else "is not a tensor payload's name")


@pytest.mark.parametrize("expression", [
    "Lambda(Symbol('s0', positive=True, integer=True), Integer(1))",
    "Function('f')(Symbol('s0', positive=True, integer=True))",
    "Piecewise((Integer(1), Symbol('s0', positive=True, integer=True) > Integer(1)))",
])
def test_a_size_expression_outside_the_grammar_is_refused(saved_llama, tmp_path, expression):
    _, _, path = saved_llama

    def edit(tree):
        first_expression(tree)["expr_str"] = expression

    _refused(rewrite(path, tmp_path / "model.pt2", program_edited(edit)),
             r"expr_str( = .*|:) is not a size expression of hfexport's grammar \(torch.export.load evaluates it")


def test_a_guard_that_runs_code_is_refused(saved_llama, tmp_path):
    """torch pastes each guard into a function the loaded module runs before every call."""
    _, _, path = saved_llama
    marker = tmp_path / "ran"

    def edit(tree):
        tree["guards_code"].append(f"{touch_expression(marker)} or True")

    tampered = rewrite(path, tmp_path / "model.pt2", program_edited(edit))
    _refused(tampered, r"guards_code\[2\]( = .*|:) is not a test on input sizes \(the loaded program runs it")
    assert not marker.exists()
    _runs_in_plain_torch(tampered, marker)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_member_whose_name_changed_case_is_always_refused(saved_llama, tmp_path, data):
    _, _, path = saved_llama
    with zipfile.ZipFile(path) as archive:
        names = [name.split("/", 1)[1] for name in archive.namelist()]
    name = data.draw(st.sampled_from(names))
    flips = data.draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    changed = "".join(c.swapcase() if flip else c for c, flip in zip(name, flips))
    assume(changed != name)
    tampered = rewrite(path, tmp_path / "model.pt2", renamed(name, changed))
    _refused(tampered, re.escape(repr(changed)))


def test_the_bytes_checked_are_the_bytes_loaded(saved_llama, monkeypatch):
    """From a path, the file is read once and torch loads those bytes; from bytes, nothing is opened."""
    model, inputs, path = saved_llama
    reads, loads = [], []
    read_bytes, load = Path.read_bytes, torch.export.load
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self) or read_bytes(self))
    monkeypatch.setattr(torch.export, "load", lambda source, **kw: loads.append(source) or load(source, **kw))
    read_program(path)
    assert reads == [path] and isinstance(loads[0], io.BytesIO) and loads[0].getvalue() == path.read_bytes()
    reads.clear()
    program = read_program(path.read_bytes()[:])
    assert reads == [path]  # only the test's own read
    with torch.no_grad():
        assert (program.module()(**inputs).logits - model(**inputs).logits).abs().max() < 1e-5
    with pytest.raises(RuntimeLoadError, match="refused to load the .pt2: it is not a zip archive"):
        read_program(b"not a zip")


def test_the_member_allowlist_is_what_torch_export_save_writes(saved_llama):
    """The allowlist is written out, not derived; this fails the day torch's layout moves."""
    from torch.export.pt2_archive import constants

    from hfexport.backends.dynamo.archive import _MEMBERS, _NUMBERED

    expected = {constants.ARCHIVE_FORMAT_PATH, constants.ARCHIVE_VERSION_PATH, constants.MODELS_FILENAME_FORMAT.format("model"),
                constants.SAMPLE_INPUTS_FILENAME_FORMAT.format("model"),
                constants.WEIGHTS_CONFIG_FILENAME_FORMAT.format("model"),
                constants.CONSTANTS_CONFIG_FILENAME_FORMAT.format("model"), ".data/version", ".data/serialization_id",
                "byteorder"}
    assert set(_MEMBERS) == expected
    assert _NUMBERED == {constants.WEIGHTS_DIR: constants.WEIGHT_FILENAME_PREFIX,
                         constants.CONSTANTS_DIR: constants.TENSOR_CONSTANT_FILENAME_PREFIX}
    with zipfile.ZipFile(saved_llama[2]) as archive:
        assert expected <= {name.split("/", 1)[1] for name in archive.namelist()}


def test_example_inputs_whose_paths_carry_code_are_refused(saved_decode, tmp_path):
    """A weights-only pickle can still name things: torch writes the paths of the example inputs'
    leaves into the source of the guard function the loaded module runs (a path's first key
    unquoted), so a cache attribute named `" + <code> + "` ran that code on the first call."""
    marker = tmp_path / "ran"
    read_program(saved_decode)  # registers the cache classes the pickle names
    with zipfile.ZipFile(saved_decode) as archive:
        args, kwargs = torch.load(io.BytesIO(archive.read("decode/data/sample_inputs/model.pt")), weights_only=True)
    layer = kwargs["past_key_values"].layers[0]
    # pathlib.Path(marker).touch(), spelled without a single quote (repr would escape it)
    spelled = "+".join(f"chr({ord(c)})" for c in "pathlib"), "+".join(f"chr({ord(c)})" for c in str(marker))
    name = f'" + str(__import__({spelled[0]}).Path({spelled[1]}).touch()) + "'
    setattr(layer, name, layer.keys.clone())
    tampered = rewrite(saved_decode, tmp_path / "decode.pt2", replaced("data/sample_inputs/model.pt", pickled((args, kwargs))))
    _refused(tampered, "its data/sample_inputs/model.pt does not nest as the program's inputs do")
    assert not marker.exists()
    delattr(layer, name)  # the real inputs again, for the call below
    with contextlib.suppress(Exception):  # the check can fail: a plain load, then a call with real inputs
        torch.export.load(tampered).module()(*args, **kwargs)
    assert marker.exists()
