"""Minimal reproduction: a statically int8-quantized RoPE-style slice fails to load in XNNPACK.

executorch 1.4.1, torch 2.13.0, torchao PT2E, `XNNPACKQuantizer` with
`get_symmetric_quantization_config(is_per_channel=True)` (the static config), static shapes.

`propagate_annotation` shares qparams through `aten.slice_copy.Tensor`, but the quantizer sees
`aten.slice.Tensor` (before `to_edge`), so a slice feeding a quantized `cat` (`rotate_half`:
`cat(-x2, x1)`) gets the cat's qparams on its output and its input's on its input. XNNPACK's
static slice requires them equal; the method fails to load:

    [XNNCompiler.cpp:1610] Failed to create static slice node 7 with code: xnn_status_invalid_parameter
    [XNNPACKBackend.cpp:143] XNNCompiler::compileModel failed: 0x1
    [method.cpp:128] Init failed for backend XnnpackBackend: 0x1
    RuntimeError: Failed to load method forward, error: 0x:1

(on a whole Llama/Qwen3 the failed init is followed by "free(): double free detected in tcache 2",
which kills the process). Upstream fix: https://github.com/pytorch/executorch/pull/21568 (after 1.4.1).
`python docs/repro_xnnpack_static_slice.py --shared` annotates the slice with its input's qparams,
as hfexport's `PT2EQuantizer` does, and the method loads and matches the quantized module exactly.
The load runs in a subprocess because the failure can take the process down.
"""

import subprocess
import sys
import tempfile

import torch


class HalfSliceCat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(16, 16, bias=False)
        self.o = torch.nn.Linear(16, 16, bias=False)
        with torch.no_grad():  # the sliced half has a smaller range than the whole: its qparams differ
            self.q.weight.view(2, 2, 4, 16)[:, 1] *= 0.25

    def forward(self, x):
        y = self.q(x).view(1, 8, 2, 8).transpose(1, 2)[..., 4:]  # the second half, as rotate_half's x2
        y = torch.cat((y, y), dim=-1).transpose(1, 2).reshape(1, 8, 16)
        return self.o(y)


def share_slices(model):
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, SharedQuantizationSpec

    for node in model.graph.nodes:
        if node.target == torch.ops.aten.slice.Tensor and "quantization_annotation" in node.args[0].meta:
            spec = SharedQuantizationSpec(node.args[0])
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map={node.args[0]: spec}, output_qspec=spec, _annotated=True)


def export(path, shared):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    class Quantizer(XNNPACKQuantizer):
        def annotate(self, model):
            model = super().annotate(model)
            if shared:
                share_slices(model)
            return model

    torch.manual_seed(0)
    x = torch.randn(1, 8, 16)
    module = torch.export.export(HalfSliceCat().eval(), (x,)).module()
    prepared = prepare_pt2e(module, Quantizer().set_global(get_symmetric_quantization_config(is_per_channel=True)))
    prepared(x)
    quantized = convert_pt2e(prepared)
    program = to_edge_transform_and_lower(torch.export.export(quantized, (x,)),
                                          partitioner=[XnnpackPartitioner()]).to_executorch()
    with open(path, "wb") as f:
        f.write(program.buffer)
    torch.save({"x": x, "want": quantized(x)}, path + ".io")


def load_and_run(path):
    from executorch.runtime import Runtime

    io = torch.load(path + ".io")
    got = Runtime.get().load_program(path).load_method("forward").execute([io["x"]])[0]
    print("loaded; max |runtime - quantized module| =", (got - io["want"]).abs().max().item())


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        load_and_run(sys.argv[2])
    else:
        path = tempfile.mkdtemp() + "/slice.pte"
        export(path, shared="--shared" in sys.argv)
        done = subprocess.run([sys.executable, __file__, "--run", path], capture_output=True, text=True)
        print("\n".join(line for line in (done.stdout + done.stderr).splitlines()
                        if "XNN" in line or "method" in line or "loaded" in line or "Error" in line))
        print("exit status", done.returncode)
