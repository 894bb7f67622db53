"""`import hfexport` stays light: no backend package is imported until its backend is used."""

from __future__ import annotations

import subprocess
import sys

BACKEND_PACKAGES = ("onnx", "onnxscript", "onnxruntime", "executorch", "openvino", "nncf", "torchao", "ray")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in out.stdout.split()}


def test_import_hfexport_loads_no_backend_package():
    loaded = _modules_after("import hfexport; hfexport.DynamoConfig; hfexport.OnnxConfig; hfexport.AutoExportConfig")
    assert not loaded & set(BACKEND_PACKAGES), loaded & set(BACKEND_PACKAGES)
    assert "torch" not in loaded and "transformers" not in loaded


def test_public_names_of_the_seed_resolve():
    import hfexport
    import hfexport.exporter_dynamo
    import hfexport.utils

    for name in ("HfExporter", "DynamoExporter", "DynamoConfig", "OnnxConfig", "ExecutorchConfig",
                 "OpenVINOConfig", "ExportFormat", "AutoExportConfig", "AutoHfExporter", "register_backend"):
        assert getattr(hfexport, name) is not None
    assert hfexport.exporter_dynamo.register_pytree_node is hfexport.register_pytree_node
    assert set(hfexport.__all__) >= {"DynamoExporter", "validate", "register_patch"}


def test_building_a_quantizer_loads_no_backend_package():
    """Quantizers (and configs holding one) are plain objects; their packages load when they run."""
    loaded = _modules_after("from hfexport.quantization import PT2EQuantizer, NNCFQuantizer, OrtQuantizer\n"
                            "PT2EQuantizer('int8-dynamic'); NNCFQuantizer('int4-weights'); OrtQuantizer('int8-dynamic')")
    assert not loaded & set(BACKEND_PACKAGES), loaded & set(BACKEND_PACKAGES)


def test_the_job_packages_runners_load_no_export_job():
    """`hfexport.job.executors` (where a batch's cells run: a Ray driver, the coverage matrix) loads
    neither the export job nor torch; `from hfexport.job import JobOptions` still gives its names."""
    out = subprocess.run([sys.executable, "-c", "import hfexport.job.executors, sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert "hfexport.job.export" not in loaded and "torch" not in loaded
    import hfexport.job
    from hfexport.job import JobOptions, export_to_folder
    from hfexport.job.export import export_to_folder as defined

    assert export_to_folder is defined and hfexport.job.JobOptions is JobOptions and "JobOptions" in dir(hfexport.job)
