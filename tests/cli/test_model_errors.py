"""A model argument that names nothing loadable fails in one line that says what happened, before any hub
request it cannot answer, and each remedy it gives runs (`hfexport.model_spec`)."""

from __future__ import annotations

import socket

import pytest

from hfexport.cli.main import main

PRESETS_HINT = "`hfexport presets` lists the tiny:NAME models, which need no files nor network"


@pytest.fixture
def no_hub(monkeypatch):
    """transformers' loading fails the test if asked: the error must come before it."""
    import transformers

    def asked(*args, **kwargs):
        raise AssertionError(f"transformers was asked to load {args[0]!r}")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", asked)


def _error(capsys, model: str, tmp_path) -> str:
    capsys.readouterr()
    assert main(["export", model, "-o", str(tmp_path / "out")]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("hfexport: error: ") and not (tmp_path / "out").exists()
    return lines[-1]


@pytest.mark.parametrize("model", ["./no-such-model", "no/such/model", "~/no-such-model"])
def test_a_missing_path_says_so_and_is_never_looked_up_on_the_hub(model, tmp_path, capsys, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)
    assert _error(capsys, model, tmp_path) == (
        f"hfexport: error: [prepare] there is no file or folder {model!r} (a path, so it was not looked up on the "
        f"hub, nor is it a tiny:NAME preset) What to do: check the path; {PRESETS_HINT}")
    assert main(["presets"]) == 0 and "tiny:llama " in capsys.readouterr().out  # the remedy runs


def test_a_broken_config_json_names_the_file_and_the_json_error_only(tmp_path, capsys, no_hub):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama",\n')
    assert _error(capsys, str(folder), tmp_path) == (
        f"hfexport: error: [prepare] {folder / 'config.json'} is not valid JSON: Expecting property name enclosed in "
        "double quotes: line 2 column 1 (char 24)")


def test_offline_by_hf_hub_offline_a_hub_id_fails_at_once_with_the_remedy(tmp_path, capsys, monkeypatch, no_hub):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    assert _error(capsys, "some-org/no-such-model", tmp_path) == (
        "hfexport: error: [prepare] 'some-org/no-such-model' is not found locally and the hub cannot be reached "
        f"(offline: HF_HUB_OFFLINE is set) What to do: pass a local folder, a .gguf file or tiny:NAME ({PRESETS_HINT})")


def _no_network(monkeypatch) -> list:
    """`socket.create_connection` failing as it does without a network (no name lookup); returns its calls."""
    tried = []

    def create_connection(address, *args, **kwargs):
        tried.append(address)
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    for name in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return tried


def test_without_a_network_a_hub_id_fails_at_the_first_attempt(tmp_path, capsys, monkeypatch, no_hub):
    tried = _no_network(monkeypatch)
    assert _error(capsys, "some-org/no-such-model", tmp_path) == (
        "hfexport: error: [prepare] 'some-org/no-such-model' is not found locally and the hub cannot be reached "
        "(offline: no connection to huggingface.co:443) What to do: pass a local folder, a .gguf file or tiny:NAME "
        f"({PRESETS_HINT})")
    assert tried == [("huggingface.co", 443)]


def test_without_a_network_a_hub_id_in_the_cache_loads_from_it_alone(tmp_path, capsys, monkeypatch):
    import transformers

    _no_network(monkeypatch)
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache",
                        lambda repo, name, revision=None: str(tmp_path / "config.json"))
    asked = []

    def from_pretrained(spec, **kwargs):
        asked.append(kwargs)
        raise OSError("stop here")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)
    assert "cannot load 'some-org/cached': stop here" in _error(capsys, "some-org/cached", tmp_path)
    assert asked == [{"revision": None, "trust_remote_code": False, "local_files_only": True}]


def test_an_unknown_preset_names_the_closest_ones_not_all(tmp_path, capsys, no_hub):
    assert _error(capsys, "tiny:lama", tmp_path) == (
        f"hfexport: error: [prepare] unknown preset 'tiny:lama'; did you mean tiny:llama or tiny:llava? What to do: "
        f"{PRESETS_HINT}")


@pytest.mark.slow
def test_the_preset_suggested_exports(tmp_path, capsys):
    assert main(["export", "tiny:llama", "--task", "forward", "--no-validate", "-q", "-o", str(tmp_path / "out")]) == 0
