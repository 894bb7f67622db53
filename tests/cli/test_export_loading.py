"""`hfexport export`'s loading options, as a user passes them: `--revision` and
`--trust-remote-code` reach every `from_pretrained`, a repository's own code runs only with the
flag, a tokenizer that fails to load is warned about and reported, and `--gguf-file` with a hub
repo is handed to transformers as a hub GGUF. No test reaches a hub: hub calls are replaced by
spies that record what they were given and load the tiny local copy instead."""

from __future__ import annotations

import json

import pytest

from hfexport.cli.main import main
from tests.harness import tiny_bpe_tokenizer


@pytest.fixture
def gpt2_folder(tmp_path):
    """A tiny GPT-2 saved by `save_pretrained`, with a tokenizer whose ids it embeds."""
    from hfexport.presets import build_preset

    model, _ = build_preset("gpt2")
    tokenizer = tiny_bpe_tokenizer()
    model.resize_token_embeddings(len(tokenizer))
    folder = tmp_path / "gpt2"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _spy(monkeypatch, cls, calls: list, local: dict | None = None) -> None:
    """Replace `cls.from_pretrained` by one that records `(class, name, kwargs)` and loads
    `local[name]` (a local copy of a hub repo) or `name` with the real one."""
    real = cls.from_pretrained

    def from_pretrained(name, *args, **kwargs):
        calls.append((cls.__name__, str(name), kwargs))
        return real((local or {}).get(str(name), name), *args, **kwargs)

    monkeypatch.setattr(cls, "from_pretrained", from_pretrained)


def _report(out) -> dict:
    return json.loads((out / "report.json").read_text())


def test_revision_and_trust_remote_code_reach_every_from_pretrained(gpt2_folder, tmp_path, monkeypatch):
    import transformers

    calls: list = []
    for cls in (transformers.AutoConfig, transformers.GPT2LMHeadModel, transformers.AutoTokenizer):
        _spy(monkeypatch, cls, calls)
    out = tmp_path / "out"
    assert main(["export", str(gpt2_folder), "--task", "forward", "--revision", "v1.0", "--no-validate", "-q", "-o",
                 str(out)]) == 0
    assert {name for name, _, _ in calls} == {"AutoConfig", "GPT2LMHeadModel", "AutoTokenizer"}
    # never None: transformers asks on stdin whether to run a repository's code when it is None
    assert all(k["revision"] == "v1.0" and k["trust_remote_code"] is False for _, _, k in calls), calls
    assert _report(out)["tokenizer"] == {"loaded": True}


def _remote_code_folder(folder):
    """`folder` (a tiny GPT-2) made a repository with its own code: a config and a model class
    transformers does not have, named in `auto_map`."""
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="tiny_remote", architectures=["TinyRemoteForCausalLM"],
                  auto_map={"AutoConfig": "configuration_tiny.TinyRemoteConfig",
                            "AutoModelForCausalLM": "modeling_tiny.TinyRemoteForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_tiny.py").write_text(
        "from transformers import GPT2Config\n\n\nclass TinyRemoteConfig(GPT2Config):\n"
        "    model_type = 'tiny_remote'\n")
    (folder / "modeling_tiny.py").write_text(
        "from transformers import GPT2LMHeadModel\n\nfrom .configuration_tiny import TinyRemoteConfig\n\n\n"
        "class TinyRemoteForCausalLM(GPT2LMHeadModel):\n    config_class = TinyRemoteConfig\n")
    return folder


def test_a_repository_s_own_code_runs_only_with_trust_remote_code(gpt2_folder, tmp_path, capsys):
    folder = _remote_code_folder(gpt2_folder)
    assert main(["export", str(folder), "--no-validate", "-q", "-o", str(tmp_path / "refused")]) == 1
    err = capsys.readouterr().err
    assert "--trust-remote-code was not given" in err and "runs the repository's code" in err
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "out"
    assert main(["export", str(folder), "--task", "forward", "--trust-remote-code", "--no-validate", "-q", "-o",
                 str(out)]) == 0
    assert _report(out)["model_class"] == "TinyRemoteForCausalLM"


def test_a_tokenizer_that_fails_to_load_is_warned_about_and_reported(gpt2_folder, tmp_path, capsys):
    tokenizer = json.loads((gpt2_folder / "tokenizer.json").read_text())
    tokenizer["model"]["type"] = "NoSuchModel"  # a file the `tokenizers` library cannot parse
    (gpt2_folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    out = tmp_path / "out"
    assert main(["export", str(gpt2_folder), "--task", "forward", "--no-validate", "-q", "-o", str(out)]) == 0
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if "tokenizer" in line]  # the CLI prints it
    assert "did not match any variant" in warning and "made from the config" in warning and "--chat" in warning
    tokenizer = _report(out)["tokenizer"]
    assert tokenizer["loaded"] is False and "did not match any variant" in tokenizer["why"]
    assert not (out / "tokenizer.json").exists()


def test_a_folder_without_tokenizer_files_is_reported_without_a_warning(tmp_path, capsys):
    from hfexport.presets import build_preset

    model, _ = build_preset("gpt2")
    model.save_pretrained(tmp_path / "gpt2")
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "gpt2"), "--task", "forward", "--no-validate", "-q", "-o", str(out)]) == 0
    assert "tokenizer" not in capsys.readouterr().err
    assert _report(out)["tokenizer"] == {"loaded": False, "why": "no tokenizer files in the folder"}


def test_gguf_file_in_a_hub_repo_is_loaded_as_transformers_loads_a_hub_gguf(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    import huggingface_hub
    import transformers

    from ..gguf_files import write_tiny_llama_gguf

    file = write_tiny_llama_gguf(tmp_path / "models" / "tiny-Q4_1.gguf")
    repo = "someone/tiny-llama-gguf"
    downloads: list = []

    def hf_hub_download(repo_id, filename, **kwargs):
        downloads.append((repo_id, filename, kwargs))
        return str(file)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    # the hub answers (hf_hub_download above): where this machine has no network, say it is reachable
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("hfexport.model_spec._can_connect", lambda host, port: True)
    calls: list = []
    for cls in (transformers.AutoConfig, transformers.AutoModelForCausalLM, transformers.LlamaForCausalLM,
                transformers.AutoTokenizer):
        _spy(monkeypatch, cls, calls, {repo: str(file.parent)})
    out = tmp_path / "out"
    assert main(["export", repo, "--task", "forward", "--gguf-file", file.name, "--revision", "abc123",
                 "--no-validate", "-q", "-o", str(out)]) == 0
    assert downloads == [(repo, file.name, {"revision": "abc123"})]
    hub = [(name, k) for name, given, k in calls if given == repo]
    assert {name for name, _ in hub} >= {"AutoConfig", "AutoTokenizer"} and len(hub) == 3, calls
    assert all(k["gguf_file"] == file.name and k["revision"] == "abc123" and k["trust_remote_code"] is False
               for _, k in hub), hub
    report = _report(out)
    assert report["model"] == f"{repo}/{file.name}" and report["weights_from"]["quantization"] == "Q4_1"
    assert report["tokenizer"] == {"loaded": True}


def test_gguf_file_in_a_missing_local_folder_is_not_taken_for_a_hub_repo(tmp_path, capsys):
    pytest.importorskip("gguf")
    assert main(["export", str(tmp_path / "nowhere"), "--gguf-file", "x.gguf", "-q", "-o", str(tmp_path / "o")]) == 1
    assert "is not a folder (nor a hub repo id" in capsys.readouterr().err


@pytest.mark.parametrize(("preset", "with_tokenizer", "segment_ids"), [
    ("gpt2", False, False),  # generate() feeds a GPT-2 no token_type_ids, nor does onnxruntime-genai
    ("gpt2", True, False),   # nor does its tokenizer give any
    ("bert", False, True),   # an encoder's segment ids, where no tokenizer says which inputs it takes
])
def test_a_folders_sample_holds_token_type_ids_only_where_the_model_is_fed_them(preset, with_tokenizer, segment_ids):
    """A folder's sample inputs (`loading.sample_inputs_for`): a GPT-2 exported from its folder took
    `token_type_ids` its tokenizer never gives, so its LLM package's decode graph read them and
    onnxruntime-genai could not run it (tests/backends/onnx/test_genai.py's GPT-2)."""
    from hfexport.loading import sample_inputs_for
    from hfexport.presets import build_preset

    model, _ = build_preset(preset)
    inputs = sample_inputs_for(model, tiny_bpe_tokenizer() if with_tokenizer else None)
    assert ("token_type_ids" in inputs) == segment_ids, sorted(inputs)
