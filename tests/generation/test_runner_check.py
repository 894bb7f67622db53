"""The export job runs each packaged LLM folder in its runtime's own runner (`job.runner_check`):
onnxruntime-genai, OpenVINO GenAI's `LLMPipeline` and ExecuTorch's `TextLLMRunner` give eager
`generate`'s 16 greedy tokens on tiny:llama (a cache of 64), a difference refuses the export with
nothing written, a runner that is not installed is reported and the export stands, and
`--no-validate` says the check was skipped. One export per format; the refusal, the missing
package and `--no-validate` reuse the ONNX one's artifacts (`export_components` patched)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.harness import require_backend

pytestmark = pytest.mark.slow  # exports to each runtime and runs its LLM runner

#: format -> the CLI's generation flags for its LLM package
FLAGS = {
    "onnx": ["--generate", "--multi-token-decode", "--static-cache", "64"],
    "openvino": ["--generate"],
    "executorch": ["--generate", "--static-cache", "64"],
}
#: format -> the modules its runner check needs beside the backend's
NEEDS = {"openvino": ("openvino_genai",), "executorch": ()}


def _export(fmt: str, out, *extra: str) -> int:
    from hfexport.cli.main import main

    return main(["export", "tiny:llama", "--format", fmt, "-o", str(out), "--quiet", *FLAGS[fmt], *extra])


@pytest.fixture(scope="module", params=list(FLAGS))
def exported(request, tmp_path_factory):
    """tiny:llama exported to each format's LLM package, its runner checked: by the CLI, ONNX's
    by the job (`onnx_job`, which the other tests reuse)."""
    fmt = request.param
    if fmt == "onnx":
        return fmt, request.getfixturevalue("onnx_job").directory
    require_backend(fmt)
    for module in NEEDS[fmt]:
        pytest.importorskip(module)
    out = tmp_path_factory.mktemp(f"runner-{fmt}") / "out"
    assert _export(fmt, out) == 0
    return fmt, out


def test_each_runtime_runner_gives_eagers_greedy_tokens(exported):
    fmt, out = exported
    runner = json.loads((out / "report.json").read_text())["runner"]
    assert runner["checked"] and runner["tokens_equal"] and runner["passed"], runner
    assert runner["tokens"] == 16 and runner["against"] == "eager generate()"
    assert runner["seconds"] > 0 and runner["compare_seconds"] > 0  # the runner's run, and eager's side
    assert runner["runner"].split()[0] == {"onnx": "onnxruntime-genai", "openvino": "openvino-genai",
                                           "executorch": "executorch"}[fmt]
    # the report the folder holds is the one its manifest hashed after the check wrote it
    from hfexport.folder.generation_export import GenerationExport

    assert GenerationExport.load(out).manifest["format"] == fmt


@pytest.fixture(scope="module")
def onnx_job(tmp_path_factory):
    """The ONNX package exported once by the job; `reuse(monkeypatch)` makes later jobs write its
    artifacts instead of exporting again."""
    require_backend("onnx")
    pytest.importorskip("onnxruntime_genai")
    from hfexport import OnnxConfig
    from hfexport.job.export import GenerationOptions, export_to_folder

    out = tmp_path_factory.mktemp("runner-onnx-job") / "out"
    result = export_to_folder("tiny:llama", OnnxConfig(dynamic=True), out,
                              generation=GenerationOptions(static_cache=64))
    return result


@pytest.fixture
def reuse(onnx_job, monkeypatch):
    from hfexport.backends.onnx.exporter import OnnxExporter

    monkeypatch.setattr(OnnxExporter, "export_components",
                        lambda self, components, config=None, **options: onnx_job.artifacts)
    return onnx_job


def test_a_runner_whose_tokens_differ_refuses_the_export_and_writes_nothing(reuse, tmp_path, monkeypatch, capsys):
    from hfexport.backends.onnx.package import OnnxRuntimePackage
    from hfexport.folder.package import RunnerTokens

    def other_tokens(self, folder, request):
        return RunnerTokens(tuple(range(request.max_new_tokens)), "onnxruntime-genai (patched)")

    monkeypatch.setattr(OnnxRuntimePackage, "run", other_tokens)
    assert _export("onnx", tmp_path / "out") == 3
    assert "does not run as it should in its runtime's LLM runner" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no output folder, no staging folder, no lock


def test_a_runner_that_fails_on_the_folder_refuses_it(reuse, tmp_path, monkeypatch):
    from hfexport import OnnxConfig
    from hfexport.backends.onnx.package import OnnxRuntimePackage
    from hfexport.errors import ValidationError
    from hfexport.job.export import GenerationOptions, export_to_folder

    def crash(self, folder, request):
        raise RuntimeError("Load model from decode.onnx failed")

    monkeypatch.setattr(OnnxRuntimePackage, "run", crash)
    with pytest.raises(ValidationError, match="LLM runner failed on it: RuntimeError: Load model"):
        export_to_folder("tiny:llama", OnnxConfig(dynamic=True), tmp_path / "out",
                         generation=GenerationOptions(static_cache=64))
    assert list(tmp_path.iterdir()) == []


def test_a_missing_runner_package_is_reported_and_the_export_stands(reuse, tmp_path, monkeypatch, capsys):
    from hfexport.folder.generation_export import GenerationExport

    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)  # `import onnxruntime_genai` raises ImportError
    assert _export("onnx", tmp_path / "out") == 0
    runner = json.loads((tmp_path / "out" / "report.json").read_text())["runner"]
    assert runner["checked"] is False and runner["why"].startswith("onnxruntime-genai is not installed")
    printed = capsys.readouterr()  # the CLI's log handler writes to stderr, the summary to stdout
    assert printed.err.count("WARNING: the export was not run in its runtime's LLM runner") == 1
    assert "runtime runner: NOT CHECKED: onnxruntime-genai is not installed" in printed.out
    folder = GenerationExport.load(tmp_path / "out")  # still a whole, hashed export with genai's config
    assert (folder.directory / "genai_config.json").is_file() and set(folder.components) == {"decode"}


def test_no_validate_says_the_runner_check_was_skipped(reuse, tmp_path, monkeypatch):
    from hfexport.backends.onnx.package import OnnxRuntimePackage

    monkeypatch.setattr(OnnxRuntimePackage, "run", lambda *args: pytest.fail("the runner ran"))
    assert _export("onnx", tmp_path / "out", "--no-validate") == 0
    runner = json.loads((tmp_path / "out" / "report.json").read_text())["runner"]
    assert runner == {"checked": False, "why": "skipped: validation was off (validate=False, --no-validate)"}


def test_a_folder_that_is_the_components_says_why(reuse, tmp_path):
    """The ONNX runner check on a folder without `genai_config.json` (its manifest says why)."""
    from hfexport.backends.onnx.genai import run_genai
    from hfexport.folder.package import RunnerRequest, RunnerUnavailable
    from hfexport.folder.manifest import runtime_package_entry, write_manifest

    write_manifest(tmp_path, {"kind": "generation", "format": "onnx", "components": {},
                              **runtime_package_entry("onnxruntime-genai", why="why not")})
    with pytest.raises(RunnerUnavailable, match="this model's folder is the components: why not"):
        run_genai(tmp_path, RunnerRequest((1, 2), 4))


def test_a_quantized_export_is_compared_with_hfexports_runner_at_the_floor(onnx_job):
    """`min_agreement` given: the runner's tokens against `GenerationRunner`'s on the same folder
    (the fp32 folder here: they agree on every step)."""
    from hfexport.auto import AutoHfExporter
    from hfexport.job.runner_check import runner_check

    package = AutoHfExporter.from_format("onnx").runtime_package()
    found = runner_check(package, onnx_job.model, onnx_job.inputs, onnx_job.model.generation_config,
                         min_agreement=0.7)(onnx_job.directory)["runner"]
    assert found["against"] == "hfexport's runner on the same folder"
    assert found["agreement"] == 1.0 and found["min_agreement"] == 0.7 and found["passed"]
