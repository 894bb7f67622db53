"""What a model argument names, checked before anything loads: a `tiny:NAME` preset, a file or folder
here, or a hub repo; one that names nothing loadable fails in one line that says what it is not, with
a remedy that works.

```
tiny:NAME        a preset, else the closest names (`hfexport presets` lists them)
a path          (starts with `.`, `/` or `~`, ends with `.gguf`, holds `\\` on Windows or more than
                 one `/`): it exists, else "no such file or folder", never looked up on the hub
a folder         its config.json parses (else the file and the JSON error, nothing else)
ORG/NAME         a hub repo: when the hub cannot be reached (HF_HUB_OFFLINE, or no connection), its
                 files from the hub cache (`local_files_only`), else an error at once, not after retries
```
"""

# NOTE: why a connection is tried before asking the hub, rather than reading the hub's error: without a
# network, huggingface_hub retries each file five times (24-30 s) and then answers that it "couldn't
# connect"; a TCP connection to the endpoint (or the HTTPS proxy) fails in milliseconds without DNS,
# and within `CONNECT_TIMEOUT` otherwise. The check runs only for a name that is no local file or folder.

from __future__ import annotations

import difflib
import json
import os
import socket
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .errors import PrepareError
from .presets import PRESETS

__all__ = ["check_preset", "check_local", "hub_options", "is_path_like", "CONNECT_TIMEOUT"]

#: Seconds the hub's endpoint gets to accept a connection before it counts as unreachable.
CONNECT_TIMEOUT = 3.0
_PRESETS_HINT = "`hfexport presets` lists the tiny:NAME models, which need no files nor network"


def is_path_like(spec: str) -> bool:
    """Whether `spec` can only be a path, never a hub repo id (ORG/NAME)."""
    return (spec.startswith((".", "/", "~")) or spec.lower().endswith(".gguf") or spec.count("/") > 1
            or any(sep in spec for sep in (os.sep, os.altsep) if sep and sep != "/"))


def check_preset(spec: str) -> None:
    """Raise `PrepareError` for a `tiny:NAME` that names no preset, with the closest names."""
    name = spec.removeprefix("tiny:")
    if name in PRESETS:
        return
    close = difflib.get_close_matches(name, PRESETS, n=3)
    guess = f"; did you mean {' or '.join('tiny:' + c for c in close)}?" if close else ""
    raise PrepareError(f"unknown preset {spec!r}{guess}", remedy=_PRESETS_HINT)


def check_local(spec: str, *, gguf_file: str | None = None) -> bool:
    """Whether `spec` is a file or folder here (True) or may be a hub repo (False); raise `PrepareError`
    for a path that does not exist (a `.gguf` one, or a folder with `gguf_file`: `loading.load_gguf`
    says so itself, naming the GGUF file), and for a model folder whose config.json does not parse."""
    path = Path(spec).expanduser()
    if not path.exists():
        if is_path_like(spec) and gguf_file is None and not spec.lower().endswith(".gguf"):
            raise PrepareError(f"there is no file or folder {spec!r} (a path, so it was not looked up on the hub, "
                               "nor is it a tiny:NAME preset)", remedy=f"check the path; {_PRESETS_HINT}")
        return False
    config = path / "config.json"
    if path.is_dir() and gguf_file is None and config.is_file():
        try:
            json.loads(config.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise PrepareError(f"{config} is not valid JSON: {error}") from error
    return True


def hub_options(repo: str, filename: str, revision: str | None = None) -> dict[str, Any]:
    """The options to load the hub repo `repo` with: none when the hub can be reached;
    `local_files_only=True` when it cannot and the hub cache holds `filename` of it.

    Raises:
        PrepareError: `repo` is no hub repo id, or the hub cannot be reached and its cache does not
            hold `filename` of `repo`.
    """
    import huggingface_hub
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as error:
        raise PrepareError(f"{repo!r} is no file or folder here, nor a hub repo id (ORG/NAME, of letters, digits, "
                           "'-', '_' and '.')",
                           remedy=f"pass a local folder, a .gguf file or a hub id; {_PRESETS_HINT}") from error
    why = _offline_reason()
    if why is None:
        return {}
    if isinstance(huggingface_hub.try_to_load_from_cache(repo, filename, revision=revision), str):
        return {"local_files_only": True}
    raise PrepareError(f"{repo!r} is not found locally and the hub cannot be reached ({why})",
                       remedy=f"pass a local folder, a .gguf file or tiny:NAME ({_PRESETS_HINT})")


def _offline_reason() -> str | None:
    """Why the hub cannot be reached (`"offline: HF_HUB_OFFLINE is set"`), or None when it can."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "offline: HF_HUB_OFFLINE is set"
    endpoint = urllib.parse.urlsplit(constants.ENDPOINT)
    host = endpoint.hostname or "huggingface.co"
    proxy = urllib.request.getproxies().get(endpoint.scheme or "https")
    if proxy and not urllib.request.proxy_bypass(host):
        through = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        address = (through.hostname, through.port or 80)
    else:
        address = (host, endpoint.port or (443 if endpoint.scheme != "http" else 80))
    if not _can_connect(*address):
        return f"offline: no connection to {address[0]}:{address[1]}"
    return None


def _can_connect(host: str, port: int) -> bool:
    """Whether `host:port` accepts a TCP connection within `CONNECT_TIMEOUT` (name lookup included)."""
    connected: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
            connected.append(True)
        except OSError:  # no route, no name, refused, timed out: unreachable, which is the answer
            connected.append(False)

    thread = threading.Thread(target=connect, name="hfexport-hub-check", daemon=True)
    thread.start()
    thread.join(CONNECT_TIMEOUT)  # a name lookup that hangs is not waited for beyond it
    return bool(connected and connected[0])
