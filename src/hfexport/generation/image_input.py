"""Generation from an image file: the processor saved with an image-text export turns an image
and a text prompt into the inputs `GenerationRunner.generate` takes.

```python
runner = GenerationRunner.load("out/llava-gen")     # hfexport export MODEL --generate, with its processor
runner.generate_from_image("cat.png", "Describe this image.", max_new_tokens=32).text
```

# NOTE: the prompt is the model's own processor's work, not ours: `image_prompt_inputs` formats
# the text with the processor's chat template (one user turn holding the image and the text) and
# calls the processor on `(image, text)`, which resizes the image and repeats the image token once
# per feature row as `model.generate` expects. So the tokens equal eager `model.generate(**processor(
# images=..., text=...))`'s, and no model family is named here.
"""

from __future__ import annotations

import os
from typing import Any

from .._versions import pip_line
from ..errors import PrepareError

__all__ = ["open_image", "prompt_text", "image_prompt_inputs", "IMAGE_INPUT_NAMES"]

#: The processor outputs the runner's image prefill reads (`multimodal.ImagePrefill`), besides `input_ids`.
IMAGE_INPUT_NAMES = ("pixel_values", "image_grid_thw")


def open_image(image: Any) -> Any:
    """`image` as an RGB `PIL.Image.Image`: a path (any format Pillow reads) or an image already open.

    Raises:
        ImportError: Pillow is not installed (`pip install "hfexport[vision]"`).
        PrepareError: the file cannot be read as an image.
    """
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as error:
        raise ImportError(f"reading an image file needs Pillow, which is not installed. Install it with: "
                          f"{pip_line('vision')}   (or pass the processor's arrays: --image-inputs FILE.npz)") from error
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if not isinstance(image, (str, os.PathLike)):
        raise TypeError(f"image takes a path or a PIL.Image.Image, got {type(image).__name__}")
    try:
        with Image.open(image) as opened:
            return opened.convert("RGB")
    except (OSError, UnidentifiedImageError) as error:
        raise PrepareError(f"cannot read {os.fspath(image)!r} as an image: {error}",
                           remedy="pass a PNG, JPEG or another file Pillow opens") from error


def prompt_text(processor: Any, prompt: str) -> str:
    """The text the processor is given: `prompt` as it is where it already holds the processor's
    image token; else one user turn (the image, then `prompt`) formatted with the processor's chat
    template and its generation prompt; else, without a template, the image token then `prompt`."""
    token = getattr(processor, "image_token", None)
    if token is None:
        raise PrepareError(f"the saved processor ({type(processor).__name__}) names no image token",
                           remedy="pass the processor's arrays with --image-inputs FILE.npz (image_inputs=...)")
    if token in prompt:
        return prompt
    if getattr(processor, "chat_template", None):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return token + prompt


def image_prompt_inputs(processor: Any, image: Any, prompt: str) -> dict[str, Any]:
    """The processor's tensors for one image and `prompt` (`prompt_text`): `input_ids` and the image
    inputs the runner takes (`IMAGE_INPUT_NAMES`, those the processor gives)."""
    inputs = processor(images=[open_image(image)], text=[prompt_text(processor, prompt)], return_tensors="pt")
    return {name: inputs[name] for name in ("input_ids", *IMAGE_INPUT_NAMES) if name in inputs}
