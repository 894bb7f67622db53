"""`$HFEXPORT_OV_COMPILE_CONFIG`: CPU plugin properties for `OpenVINORunner`'s compiles (what
`LLMPipeline(folder, "CPU", **properties)` is given on the vendor's side), typed and checked: the
compiled model runs with them, a generation keeps eager's tokens, a wrong value is refused."""

from __future__ import annotations

import json
import random

import pytest

ov = pytest.importorskip("openvino")

from hfexport import GenerationRunner  # noqa: E402
from hfexport.backends.openvino.runner import COMPILE_CONFIG_ENV, compile_properties  # noqa: E402
from hfexport.errors import RuntimeLoadError  # noqa: E402


@pytest.mark.parametrize(("text", "says"), [
    ("{ENABLE_CPU_PINNING: false}", "is not JSON"),
    ('["ENABLE_CPU_PINNING", false]', "not an object"),
    ('{"INFERENCE_NUM_THREADS": {"value": 1}}', "no CPU plugin property value"),
])
def test_a_malformed_config_is_refused_with_what_to_write(monkeypatch, text, says):
    monkeypatch.setenv(COMPILE_CONFIG_ENV, text)
    with pytest.raises(RuntimeLoadError, match=says) as error:
        compile_properties()
    assert "ENABLE_CPU_PINNING" in str(error.value)  # the example in the remedy


@pytest.mark.slow
def test_the_properties_reach_the_compiled_model_and_generation_keeps_eagers_tokens(saved_generation, monkeypatch):
    saved = saved_generation("openvino", "llama")
    new_tokens = random.Random(5).randint(5, 8)  # a drawn length, the same each run
    monkeypatch.delenv(COMPILE_CONFIG_ENV, raising=False)
    assert "ov_compile" not in GenerationRunner.load(saved.directory).runners["decode"].record.details
    properties = {"ENABLE_CPU_PINNING": False, "INFERENCE_NUM_THREADS": 1, "KV_CACHE_PRECISION": "u8"}
    monkeypatch.setenv(COMPILE_CONFIG_ENV, json.dumps(properties))
    runner = GenerationRunner.load(saved.directory)
    decode = runner.runners["decode"]
    assert decode.compiled.get_property("ENABLE_CPU_PINNING") is False
    assert decode.compiled.get_property("INFERENCE_NUM_THREADS") == 1
    assert str(decode.compiled.get_property("KV_CACHE_PRECISION")) == str(ov.Type.u8)
    # the recorded fp32 precision still applies (the precision hook), and the record says what was given
    assert str(decode.compiled.get_property("INFERENCE_PRECISION_HINT")) == str(ov.Type.f32)
    assert decode.record.details["ov_compile"] == properties
    got = runner.generate(saved.inputs["input_ids"], max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    assert got.tokens == saved.eager(new_tokens)[0]


@pytest.mark.slow
def test_a_property_the_cpu_plugin_refuses_names_the_variable(saved_generation, monkeypatch):
    saved = saved_generation("openvino", "llama")
    monkeypatch.setenv(COMPILE_CONFIG_ENV, json.dumps({"NO_SUCH_PROPERTY": 1}))
    with pytest.raises(RuntimeLoadError, match=f"the CPU plugin refused {COMPILE_CONFIG_ENV}") as error:
        GenerationRunner.load(saved.directory)
    assert "NO_SUCH_PROPERTY" in str(error.value) and "unset it" in str(error.value)
