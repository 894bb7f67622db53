"""The manifest's one `runtime_package` entry (`hfexport.folder.manifest`): written in one shape for every
runtime's runner, checked as a folder from elsewhere is, and read from the five shapes version 3
wrote instead, so that folders written before it keep opening in their runners.

No export here: each folder is a few small files and a manifest written as the backends write it
(the backends' own entries are checked on real exports in tests/generation/test_llm_package.py,
tests/backends/openvino/test_vlm.py and tests/backends/executorch/test_multimodal.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hfexport.errors import ExportFolderError
from hfexport.folder.manifest import (MANIFEST_VERSION, RUNNERS, file_table, read_manifest, runtime_package,
                               runtime_package_entry, upgrade_manifest, write_manifest)

#: `(format, files written, version 3's entries, the runtime_package entry read from them)`
LEGACY = {
    "onnxruntime-genai": (
        "onnx", ["decode.onnx", "decode.onnx.data", "genai_config.json"],
        {"onnxruntime_genai": {"config": "genai_config.json"}},
        {"runner": "onnxruntime-genai", "ready": True, "why": None,
         "files": ["decode.onnx", "decode.onnx.data", "genai_config.json"], "settings": {}}),
    "onnxruntime-genai refused": (
        "onnx", ["decode.onnx"],
        {"onnxruntime_genai": {"config": None, "reason": "the decode graph has no GroupQueryAttention"}},
        {"runner": "onnxruntime-genai", "ready": False, "why": "the decode graph has no GroupQueryAttention",
         "files": [], "settings": {}}),
    "LLMPipeline": (
        "openvino", ["openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_tokenizer.bin"],
        {"openvino_genai": {"model": "openvino_model.xml", "properties": {"KV_CACHE_PRECISION": "f32"},
                            "llm_pipeline": True, "tokenizer": ["openvino_tokenizer.xml", "openvino_tokenizer.bin"]}},
        {"runner": "LLMPipeline", "ready": True, "why": None,
         "files": ["openvino_model.bin", "openvino_model.xml", "openvino_tokenizer.bin", "openvino_tokenizer.xml"],
         "settings": {"model": "openvino_model.xml", "properties": {"KV_CACHE_PRECISION": "f32"}}}),
    "LLMPipeline refused": (
        "openvino", ["decode.xml", "decode.bin"],
        {"openvino_genai": {"llm_pipeline": False, "why": "a sliding window of 4 tokens"}},
        {"runner": "LLMPipeline", "ready": False, "why": "a sliding window of 4 tokens", "files": [],
         "settings": {"properties": {}}}),
    "VLMPipeline": (
        "openvino", ["openvino_language_model.xml", "openvino_language_model.bin", "preprocessor_config.json"],
        {"openvino_genai_vlm": {"models": {"vlm_language_model": "openvino_language_model.xml"}, "properties": {},
                                "vlm_pipeline": True, "tokenizer": [], "image_processor": "preprocessor_config.json"}},
        {"runner": "VLMPipeline", "ready": True, "why": None,
         "files": ["openvino_language_model.bin", "openvino_language_model.xml", "preprocessor_config.json"],
         "settings": {"models": {"vlm_language_model": "openvino_language_model.xml"}, "properties": {}}}),
    "MultimodalRunner": (
        "executorch", ["multimodal.pte", "tokenizer.json"],
        {"executorch_multimodal_runner": {"program": "multimodal.pte", "data": None, "methods": ["token_embedding"],
                                          "image_token_id": 9, "max_cache_len": 64, "tokenizer": "tokenizer.json",
                                          "multimodal_runner": True}},
        {"runner": "MultimodalRunner", "ready": True, "why": None, "files": ["multimodal.pte", "tokenizer.json"],
         "settings": {"program": "multimodal.pte", "data": None, "methods": ["token_embedding"], "image_token_id": 9,
                      "max_cache_len": 64}}),
    "TextLLMRunner": (
        "executorch", ["decode.pte", "decode.ptd", "tokenizer.json"], {"cache": "program", "max_cache_len": 64},
        {"runner": "TextLLMRunner", "ready": True, "why": None, "files": ["decode.ptd", "decode.pte", "tokenizer.json"],
         "settings": {"program": "decode.pte", "data": "decode.ptd"}}),
    "TextLLMRunner without a tokenizer": (  # as the writer says it: the program runs, the runner needs one
        "executorch", ["decode.pte"], {"cache": "program", "max_cache_len": 64},
        {"runner": "TextLLMRunner", "ready": False,
         "why": "the export was given no tokenizer: TextLLMRunner needs tokenizer.json", "files": [],
         "settings": {"program": "decode.pte", "data": None}}),
}


def _folder(tmp_path: Path, names: list[str]) -> Path:
    folder = tmp_path / "export"
    folder.mkdir()
    for name in names:
        (folder / name).write_bytes(name.encode())
    return folder


def _write_v3(folder: Path, format: str, entries: dict) -> None:
    """A manifest as hfexport 0.4 (version 3) wrote it: every file hashed, the old entries."""
    decode = {"files": [p.name for p in sorted(folder.iterdir()) if p.name.startswith("decode.")], "inputs": [],
              "outputs": []}
    manifest = {"hfexport_manifest": 3, "kind": "generation", "format": format, "components": {"decode": decode},
                **entries,
                "files": file_table(folder)}
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("case", list(LEGACY))
def test_version_3s_entries_are_read_as_the_one_runtime_package(tmp_path, case):
    format, names, entries, expected = LEGACY[case]
    folder = _folder(tmp_path, names)
    _write_v3(folder, format, entries)
    manifest = read_manifest(folder)
    assert manifest["runtime_package"] == expected
    assert not set(manifest) & {"onnxruntime_genai", "openvino_genai", "openvino_genai_vlm",
                                "executorch_multimodal_runner"}, "the old entries are read as runtime_package only"
    assert runtime_package(manifest, expected["runner"]) == expected
    assert runtime_package(manifest, next(r for r in RUNNERS if r != expected["runner"])) is None


@pytest.mark.parametrize("case", ["onnxruntime-genai", "LLMPipeline refused", "TextLLMRunner"])
def test_verify_upgrade_rewrites_version_3_as_version_4(tmp_path, case):
    """`upgrade_manifest` (`hfexport verify --upgrade`, which then opens the folder in its runtime:
    tests/test_manifest.py) writes the entry the reader makes of version 3's."""
    format, names, entries, expected = LEGACY[case]
    folder = _folder(tmp_path, names)
    _write_v3(folder, format, entries)
    assert upgrade_manifest(folder) == 3
    written = json.loads((folder / "manifest.json").read_text())
    assert written["hfexport_manifest"] == MANIFEST_VERSION == 4 and written["runtime_package"] == expected
    assert not set(written) & {"onnxruntime_genai", "openvino_genai"}
    assert upgrade_manifest(folder) is None  # the current version: nothing to do


def test_a_version_3_entry_naming_a_file_it_does_not_list_is_refused(tmp_path):
    """Converted, a version-3 entry is checked as a version-4 one is: its files must be listed."""
    folder = _folder(tmp_path, ["decode.onnx"])
    _write_v3(folder, "onnx", {"onnxruntime_genai": {"config": "../genai_config.json"}})
    with pytest.raises(ExportFolderError, match=r"names '../genai_config.json' for its runtime package without "
                                                r"listing it under 'files'"):
        read_manifest(folder)


def test_a_written_entry_reads_back_as_written(tmp_path):
    folder = _folder(tmp_path, ["decode.pte", "tokenizer.json"])
    entry = runtime_package_entry("TextLLMRunner", files=["tokenizer.json", "decode.pte", "decode.pte"],
                                  settings={"program": "decode.pte", "data": None})
    write_manifest(folder, {"kind": "generation", "format": "executorch", "components": {}, **entry})
    assert read_manifest(folder)["runtime_package"] == {
        "runner": "TextLLMRunner", "ready": True, "why": None, "files": ["decode.pte", "tokenizer.json"],
        "settings": {"program": "decode.pte", "data": None}}
    refused = runtime_package_entry("LLMPipeline", why="no tokenizer was given")["runtime_package"]
    assert refused["ready"] is False and refused["files"] == [] and refused["why"] == "no tokenizer was given"
    with pytest.raises(ValueError, match="unknown runtime runner 'SpeechRunner'"):
        runtime_package_entry("SpeechRunner")


@pytest.mark.parametrize(("change", "message"), [
    (lambda e: e.update(extra=1), "a 'runtime_package' entry of another shape than hfexport writes"),
    (lambda e: e.pop("settings"), "a 'runtime_package' entry of another shape than hfexport writes"),
    (lambda e: e.update(ready="yes"), "a 'runtime_package' entry of another shape than hfexport writes"),
    (lambda e: e.update(files="decode.pte"), "a 'runtime_package' entry of another shape than hfexport writes"),
    (lambda e: e.update(runner="LLMPipeline"), "names 'LLMPipeline' as the runner of a executorch export"),
    (lambda e: e.update(runner="os.system"), "names 'os.system' as the runner of a executorch export"),
    (lambda e: e.update(why="but not really"), "is ready and says why not, or neither"),
    (lambda e: e.update(ready=False), "is ready and says why not, or neither"),
    (lambda e: e["files"].append("/etc/passwd"), "names '/etc/passwd' for its runtime package without listing it"),
    (lambda e: e["files"].append(7), "names 7 for its runtime package without listing it"),
])
def test_a_crafted_entry_is_refused_in_one_line(tmp_path, change, message):
    folder = _folder(tmp_path, ["decode.pte"])
    entry = runtime_package_entry("TextLLMRunner", files=["decode.pte"], settings={"program": "decode.pte"})
    change(entry["runtime_package"])
    write_manifest(folder, {"kind": "generation", "format": "executorch", "components": {}, **entry})
    with pytest.raises(ExportFolderError) as error:
        read_manifest(folder)
    assert message in str(error.value) and "manifest.json" in str(error.value)


@pytest.mark.parametrize("settings", [{"program": "other.pte"}, {"data": "../decode.ptd"}, {"model": "/etc/hosts"},
                                      {"models": {"vision_embeddings": "elsewhere.xml"}}, {"models": "x.xml"}])
def test_a_setting_naming_a_file_the_manifest_does_not_list_is_refused(tmp_path, settings):
    """A runner is handed the files its settings name (a program, its data, an OpenVINO model): each
    must be one the manifest lists, ready or not."""
    folder = _folder(tmp_path, ["decode.pte"])
    for why in (None, "not ready"):
        entry = runtime_package_entry("TextLLMRunner", files=[] if why else ["decode.pte"], why=why, settings=settings)
        write_manifest(folder, {"kind": "generation", "format": "executorch", "components": {}, **entry})
        with pytest.raises(ExportFolderError, match="for its runtime package without listing it"):
            read_manifest(folder)


@pytest.mark.parametrize(("properties", "refused"), [
    ({"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "u8"}, False),
    ({}, False),
    ({"CACHE_DIR": "/tmp/elsewhere"}, True),
    ({"INFERENCE_PRECISION_HINT": "f64"}, True),
    ({"KV_CACHE_PRECISION": None}, True),
    (["INFERENCE_PRECISION_HINT"], True),
])
def test_the_compile_properties_an_openvino_folder_gives_its_engine_are_an_export_s_precisions(properties, refused):
    """`LLMPipeline` is given the runtime package's properties: only the precisions an export
    records pass (a `CACHE_DIR` would have OpenVINO write where the folder says)."""
    from types import SimpleNamespace

    from hfexport.backends.openvino.package import OpenVINORuntimePackage

    manifest = {"files": {}, "runtime_package": {"settings": {"properties": properties}}}
    package, listed = OpenVINORuntimePackage(None), SimpleNamespace(folder=Path("export"))
    if refused:
        with pytest.raises(ExportFolderError, match="an export records only a precision"):
            package.check_listed(manifest, listed)
    else:
        package.check_listed(manifest, listed)


#: `(format, task) -> the package class's name`: each runner's own package, and a task the format has
#: no runner for getting its text-generation package (whose manifest entry says why its runner does
#: not open the folder), or the components as asked where the format has none.
PACKAGE_OF = {("onnx", "text-generation"): "OnnxRuntimePackage",
              ("onnx", "image-text-to-text"): "OnnxRuntimePackage",
              ("onnx", "automatic-speech-recognition"): "OgWhisperPackage",
              ("openvino", "text-generation"): "LLMPipelinePackage",
              ("openvino", "image-text-to-text"): "VLMPipelinePackage",
              ("openvino", "automatic-speech-recognition"): "WhisperPipelinePackage",
              ("executorch", "text-generation"): "TextLLMRunnerPackage",
              ("executorch", "image-text-to-text"): "MultimodalRunnerPackage",
              ("executorch", "automatic-speech-recognition"): "AudioMultimodalRunnerPackage",
              ("dynamo", "text-generation"): "RuntimePackage",
              ("dynamo", "image-text-to-text"): "RuntimePackage"}


@pytest.mark.parametrize(("fmt", "task"), sorted(PACKAGE_OF))
def test_each_format_and_task_gets_its_runners_package(fmt, task):
    from hfexport.auto import AutoHfExporter
    from tests.harness import require_backend

    require_backend(fmt)
    package = AutoHfExporter.from_format(fmt).runtime_package(task)
    assert type(package).__name__ == PACKAGE_OF[fmt, task] and package.exporter.format == fmt


@pytest.mark.parametrize(("preset", "task"), [("llama", "text-generation"), ("t5", "text-generation"),
                                               ("llava", "image-text-to-text"), ("qwen2_vl", "image-text-to-text"),
                                               ("whisper", "automatic-speech-recognition")])
def test_a_models_task_is_what_it_reads(preset, task):
    """`package_task`: by the model's towers and main input; without the model, by the components saved."""
    from hfexport.generation.components import package_task
    from hfexport.presets import build_preset

    assert package_task(build_preset(preset)[0]) == task
    names = {"text-generation": ["prefill", "decode"], "image-text-to-text": ["image_encoder", "decode"],
             "automatic-speech-recognition": ["audio_encoder", "decode"]}[task]
    if preset not in ("t5", "whisper"):  # an encoder-decoder's components are named alike whatever it reads
        assert package_task(None, names) == task


def test_a_new_runtime_package_is_one_class_and_its_registration():
    """What a speech runner's package will be: a subclass registered for its format and task, which
    `runtime_package(task)` then gives; a task that is none of `PACKAGE_TASKS`, or a class that is no
    `RuntimePackage`, is refused when registered."""
    from hfexport.auto import AutoHfExporter
    from hfexport.errors import RegistryError
    from hfexport.folder.package import PACKAGES, RuntimePackage, register_package

    @register_package("dynamo", "automatic-speech-recognition")
    class SpeechPackage(RuntimePackage):
        pass

    try:
        package = AutoHfExporter.from_format("dynamo").runtime_package("automatic-speech-recognition")
        assert type(package) is SpeechPackage and SpeechPackage.task == "automatic-speech-recognition"
        with pytest.raises(RegistryError, match="already registered"):
            register_package("dynamo", "automatic-speech-recognition")(SpeechPackage)
    finally:
        PACKAGES.remove("dynamo/automatic-speech-recognition")
    with pytest.raises(RegistryError, match="automatic-speech-recognition"):
        register_package("dynamo", "speech")
    with pytest.raises(RegistryError, match="RuntimePackage subclass"):
        register_package("dynamo", "text-generation")(object)
    with pytest.raises(ValueError, match="no task 'speech'"):
        AutoHfExporter.from_format("dynamo").runtime_package("speech")
