import sys, os, subprocess, torch
import hfexport.backends.executorch.exporter as ex
ex._refuse_static_quantized_rotary = lambda *a, **k: None
from hfexport import ExecutorchExporter, ExecutorchConfig, record_of
from hfexport.quantization import PT2EQuantizer
from hfexport.presets import build_preset
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config
name, dyn, mode = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
over = eval(sys.argv[4]) if len(sys.argv) > 4 else {}
A = torch.ops.aten
allowed = {"all": None,
           "linear": {A.linear.default},
           "linear_add": {A.linear.default, A.add.Tensor},
           "linear_mul": {A.linear.default, A.mul.Tensor},
           "linear_cat": {A.linear.default, A.cat.default},
           "no_cat": {A.linear.default, A.mul.Tensor, A.add.Tensor},
           "no_mul": {A.linear.default, A.cat.default, A.add.Tensor},
           "no_add": {A.linear.default, A.cat.default, A.mul.Tensor},
           }.get(mode, "stack")
model, inputs = build_preset(name, 0, **over)
q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
def where(n):
    st = n.meta.get("stack_trace", "") or ""
    mod = list(n.meta.get("nn_module_stack", {}).values())[-1][0] if n.meta.get("nn_module_stack") else ""
    return st, mod
SEL = {"rot": lambda st, mod: "apply_rotary_pos_emb" in st or "rotary_emb" in mod,
       "rotemb": lambda st, mod: "rotary_emb" in mod,
       "applyrot": lambda st, mod: "apply_rotary_pos_emb" in st,
       "norm": lambda st, mod: mod.endswith("norm"),
       "mlp": lambda st, mod: mod.endswith("mlp")}
if allowed == "stack":
    sel = SEL[mode]
    q.set_filter_function(lambda n: n.target == A.linear.default or (n.target in (A.mul.Tensor, A.add.Tensor) and sel(*where(n))))
elif allowed is not None:
    q.set_filter_function(lambda n: n.target in allowed)
cfg = ExecutorchConfig(backend="xnnpack", dynamic=dyn, quantizer=PT2EQuantizer(q))
prog = ExecutorchExporter().export(model, inputs, config=cfg)
path = f"/tmp/int8/b_{name}_{int(dyn)}_{mode}.pte"
open(path, "wb").write(prog.buffer)
rec = record_of(prog)
with torch.no_grad():
    want = model(**inputs).logits
torch.save({"inputs": rec.artifact_inputs(inputs), "want": want}, path + ".io")
env = dict(os.environ, MALLOC_CHECK_="3", MALLOC_PERTURB_="165")
r = subprocess.run([sys.executable, "/tmp/int8/load2.py", path], capture_output=True, text=True, env=env)
print(name, dyn, mode, rec.details.get("delegation"), "rc", r.returncode, "|", " ".join(l for l in (r.stdout + r.stderr).splitlines() if l.startswith(("cos", "loaded", "Runtime", "[method", "double", "free", "corrupt", "malloc")))[-500:], flush=True)
