"""The tokenizer (and an image-text or speech model's processor) an export folder carries: its files, its
chat template, and reading them back.

```
out/tiny-llama/
  tokenizer.json, tokenizer_config.json   what `tokenizer.save_pretrained` writes (+ vocab/merges files
                                          for a slow tokenizer, special_tokens_map.json where it has one)
  chat_template.jinja                     the chat template, where the tokenizer has one
  processor_config.json                   an image-text or speech model's processor, where it came with one
                                          (the image processor's or the feature extractor's settings;
                                          preprocessor_config.json for some)
```
`save_tokenizer_files` and `save_processor_files` are the one place an export writes them
(`bundle.save_folder`, for every kind of export); a runtime's own tokenizer files (a genai config,
a converted OpenVINO tokenizer) are written beside them by that runtime's packaging.
`load_tokenizer` opens them again (`hfexport generate`, `hfexport chat`), `load_processor` the
processor (`hfexport generate --image`, `--audio`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE_FILE", "PROCESSOR_FILES", "save_tokenizer_files", "load_tokenizer", "has_tokenizer",
           "save_processor_files", "has_processor", "load_processor", "processor_class",
           "buildable_processor_class", "is_metadata_file"]

CHAT_TEMPLATE_FILE = "chat_template.jinja"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: What a processor's `save_pretrained` writes besides its tokenizer (transformers 5.24: the
#: processor's and its image processor's settings in `processor_config.json`; older processors
#: and a lone image processor write `preprocessor_config.json`).
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
#: The suffixes of the files transformers reads back from an export folder: the configs, the
#: tokenizer (JSON, a chat template, vocabulary and merges as text, a SentencePiece `.model`, a
#: tiktoken vocabulary) and a processor's settings. What else a folder holds (a `.py` an
#: `auto_map` names among them) is never given to transformers (`is_metadata_file`).
_METADATA_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")


def is_metadata_file(relative: str) -> bool:
    """Whether `relative` (a path an export folder's manifest lists) is a file transformers reads
    back as a config, tokenizer or processor file (`_METADATA_SUFFIXES`, at the folder's top)."""
    return "/" not in relative and relative.endswith(_METADATA_SUFFIXES)


def save_tokenizer_files(tokenizer: Any, folder: str | os.PathLike) -> list[str]:
    """Write `tokenizer` into `folder` with its chat template; return the names of the files written.

    transformers 5.24's `save_pretrained` writes the template as `chat_template.jinja`; a tokenizer
    whose `save_pretrained` does not (an older class, a template set by hand) gets it written here,
    so every export of a chat model can apply its template (`hfexport generate --chat`).
    """
    return _save_with_template(tokenizer, folder)


def has_tokenizer(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds tokenizer files."""
    return any((Path(folder) / name).is_file() for name in _TOKENIZER_FILES)


def load_tokenizer(folder: str | os.PathLike) -> Any:
    """The tokenizer saved in `folder` (with its chat template), or None where it holds none. No
    code the folder names is run: `trust_remote_code=False` (a `tokenizer_config.json` whose
    `auto_map` names a module of its own loads transformers' class for it, or fails; never prompts)."""
    if not has_tokenizer(folder):
        return None
    from transformers import AutoTokenizer

    return _load_with_template(AutoTokenizer, folder)


def save_processor_files(processor: Any, folder: str | os.PathLike) -> list[str]:
    """Write `processor` (an image-text model's processor: image processor, tokenizer, chat
    template; a speech model's: feature extractor, tokenizer) into `folder` with `save_pretrained`;
    return the names of the files written."""
    return _save_with_template(processor, folder)


def has_processor(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a processor's files (`PROCESSOR_FILES`)."""
    return any((Path(folder) / name).is_file() for name in PROCESSOR_FILES)


def load_processor(folder: str | os.PathLike) -> Any:
    """The processor saved in `folder` (`processor_class`, with its chat template), or None where it
    holds none; as `load_tokenizer`, no code the folder names is run.

    Raises:
        ImportError: transformers needs a package to build it (Pillow for an image processor).
    """
    if not has_processor(folder):
        return None
    return _load_with_template(processor_class(folder, trust_remote_code=False, local_files_only=True), folder)


def processor_class(spec: str | os.PathLike, **kwargs: Any) -> Any:
    """The class whose `from_pretrained(spec)` builds the image-text processor of `spec` (a folder or
    a hub repo; `kwargs` go to `AutoConfig` where the folder does not name its processor's class):
    `transformers.AutoProcessor`, or, where the processor takes a video processor and torchvision is
    not installed, the processor's own class without its video processor (`buildable_processor_class`).

    transformers 5.24 builds no video processor without torchvision, and so no processor that takes
    one (Qwen2-VL's), though its image processor has a Pillow backend. No hfexport extra installs
    torchvision (no wheel of it runs beside the CPU torch build), and `hfexport generate` gives a
    processor images and text only, so it loses nothing without one.
    """
    import transformers
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return transformers.AutoProcessor
    named = getattr(transformers, _processor_class_name(spec, **kwargs) or "", None)
    if not (isinstance(named, type) and issubclass(named, transformers.ProcessorMixin)
            and "video_processor" in named.get_attributes()):
        return transformers.AutoProcessor
    return _images_only(named)


def buildable_processor_class(processor: type) -> type:
    """`processor` (a `transformers.ProcessorMixin` class), or where it takes a video processor and
    torchvision is not installed, `processor` built, loaded and saved without one (`processor_class`)."""
    from transformers.utils import is_torchvision_available

    if is_torchvision_available() or "video_processor" not in processor.get_attributes():
        return processor
    return _images_only(processor)


def _processor_class_name(spec: str | os.PathLike, **kwargs: Any) -> str | None:
    """The processor class `spec` names: in its processor's saved settings (`PROCESSOR_FILES`, a
    local folder), else the one transformers maps its config's model type to; None where neither."""
    import json

    for name in PROCESSOR_FILES:
        path = Path(spec) / name
        if path.is_file():
            try:
                named = json.loads(path.read_text()).get("processor_class")
            except (OSError, ValueError):
                named = None
            if isinstance(named, str):
                return named
    import transformers
    # transformers 5.24: model type -> processor class name, what AutoProcessor reads
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    try:
        config = transformers.AutoConfig.from_pretrained(spec, **kwargs)
    except (OSError, ValueError):
        return None
    named = PROCESSOR_MAPPING_NAMES.get(config.model_type)
    return named if isinstance(named, str) else None


@functools.cache
def _images_only(processor: type) -> type:
    """`processor` (a `transformers.ProcessorMixin` class taking a video processor) built and loaded
    without one: images and text in, as before; videos refused by the class itself (it reads the
    missing `video_processor` attribute)."""

    class ImagesOnly(processor):  # type: ignore[misc, valid-type]
        @classmethod
        def get_attributes(cls) -> list[str]:
            # transformers 5.24: `ProcessorMixin.__init__`, `from_pretrained` and `save_pretrained`
            # build, load and save the sub-processors this lists
            return [name for name in super().get_attributes() if name != "video_processor"]

    # saved as, and read back by AutoProcessor as, the model's own processor class
    ImagesOnly.__name__ = ImagesOnly.__qualname__ = processor.__name__
    return ImagesOnly


def _save_with_template(saved: Any, folder: str | os.PathLike) -> list[str]:
    """`saved.save_pretrained(folder)` (a tokenizer or a processor), its chat template written as
    `CHAT_TEMPLATE_FILE` where `save_pretrained` did not; the names of the files written."""
    folder = Path(folder)
    before = set(os.listdir(folder))
    saved.save_pretrained(folder)
    template = getattr(saved, "chat_template", None)
    if isinstance(template, str) and not (folder / CHAT_TEMPLATE_FILE).exists():
        (folder / CHAT_TEMPLATE_FILE).write_text(template)
    return sorted(set(os.listdir(folder)) - before)


def _load_with_template(auto_class: Any, folder: str | os.PathLike) -> Any:
    """`auto_class.from_pretrained(folder)` (local files, no remote code), given the folder's
    `CHAT_TEMPLATE_FILE` where it has no template."""
    loaded = auto_class.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    template = Path(folder) / CHAT_TEMPLATE_FILE
    if getattr(loaded, "chat_template", None) is None and template.is_file():
        loaded.chat_template = template.read_text()
    return loaded
