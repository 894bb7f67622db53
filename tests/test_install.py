"""Installing hfexport beside a user's stack: pip's resolver keeps a torch or transformers (and every
backend package) that pyproject.toml's ranges admit, where the old exact pins replaced it.

# NOTE: what this runs and what it does not. It runs the pip of the test environment (`pip
# --python`) on a fresh, empty virtual environment into which fake distributions are "installed"
# (a `<name>-<version>.dist-info/METADATA` each, no code): every package of TESTED_VERSIONS at its
# next patch release, as a user's environment would hold them. The package index is a folder of
# metadata-only wheels: hfexport itself, its METADATA written from pyproject.toml's requirements
# (what setuptools writes from them, without running setuptools), and every package at its tested
# version, which is what the old pins would pull. `pip install --dry-run --no-index --report` then
# resolves `hfexport[all,ray]` offline with pip's own resolver and reports what it would install.
# It proves that the ranges, as pip reads them, keep the installed versions when the index offers
# the tested ones; it does not build hfexport's wheel, download anything, or check that hfexport
# works with those versions (that is what CI, installing with constraints.txt, does).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tomllib
import zipfile

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from hfexport._versions import TESTED_VERSIONS

ROOT = pathlib.Path(__file__).parents[1]
#: The extras a user would ask for that between them need every package of TESTED_VERSIONS.
EXTRAS_WANTED = "all,ray"
#: Core requirements with no tested version, "installed" at any version.
UNTESTED_CORE = {"numpy": "2.0.0", "packaging": "24.0", "filelock": "3.12.0"}


def _next_patch(version: str) -> str:
    """`version` with its last release number one higher (`2.13.0` -> `2.13.1`)."""
    release = list(Version(version).release)
    release[-1] += 1
    return ".".join(map(str, release))


def _metadata(name: str, version: str, requires: list[str] = (), extras: tuple[str, ...] = ()) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", "Requires-Python: >=3.11"]
    lines += [f"Provides-Extra: {extra}" for extra in extras]
    lines += [f"Requires-Dist: {requirement}" for requirement in requires]
    return "\n".join(lines) + "\n"


def _install_fake(site: pathlib.Path, name: str, version: str) -> None:
    """Make `name` `version` look installed in the environment whose site-packages is `site`."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(_metadata(name, version))
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


def _write_wheel(folder: pathlib.Path, name: str, version: str, requires: list[str] = (),
                 extras: tuple[str, ...] = ()) -> None:
    """A wheel of `name` `version` holding only its metadata."""
    stem = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{stem}.dist-info/METADATA": _metadata(name, version, requires, extras),
        f"{stem}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests/test_install.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{stem}.dist-info/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{stem}.dist-info/RECORD"])
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


def _hfexport_requires(pin_tested: bool) -> tuple[list[str], tuple[str, ...]]:
    """Requires-Dist lines and extras of hfexport from pyproject.toml; `pin_tested` puts the
    seed's exact pins (`torch==2.13.0`) in place of the ranges, for the comparison."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def line(text: str, extra: str | None) -> str:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if pin_tested and name in TESTED_VERSIONS:
            requirement.specifier = type(requirement.specifier)(f"=={TESTED_VERSIONS[name]}")
        if extra is not None:
            marker = f"({requirement.marker}) and " if requirement.marker else ""
            requirement.marker = None
            return f'{requirement}; {marker}extra == "{extra}"'
        return str(requirement)

    requires = [line(text, None) for text in project["dependencies"]]
    extras = project["optional-dependencies"]
    requires += [line(text, extra) for extra, texts in extras.items() for text in texts]
    return requires, tuple(extras)


def _resolve_beside_user_stack(tmp_path: pathlib.Path, *, pin_tested: bool) -> subprocess.CompletedProcess:
    """Run pip's resolver on `hfexport[all,ray]` in an environment holding every tested package at
    its next patch release, offline; return the finished pip (its report in tmp_path/report.json)."""
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = pathlib.Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       check=True, capture_output=True, text=True).stdout.strip())
    index = tmp_path / "index"
    index.mkdir()
    for name, version in TESTED_VERSIONS.items():
        _install_fake(site, name, _next_patch(version))
        _write_wheel(index, name, version)
    for name, version in UNTESTED_CORE.items():
        _install_fake(site, name, version)
    requires, extras = _hfexport_requires(pin_tested)
    _write_wheel(index, "hfexport", tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"],
                 requires, extras)
    # no pip.conf, no PIP_* variables: this machine's find-links, index and constraints stay out
    environment = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    environment.update(PIP_CONFIG_FILE=os.devnull, PYTHONPATH="")
    command = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "install",
               "--dry-run", "--no-index", "--find-links", str(index), "--quiet", "--report",
               str(tmp_path / "report.json"), f"hfexport[{EXTRAS_WANTED}]"]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)


def _would_install(tmp_path: pathlib.Path) -> dict[str, str]:
    report = json.loads((tmp_path / "report.json").read_text())
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}


def test_install_keeps_the_users_patch_releases(tmp_path):
    """The done-when of the ranges: torch 2.13.1 and transformers 5.24.1 (and every backend package
    at its next patch release) stay; pip installs hfexport and nothing else."""
    pip = _resolve_beside_user_stack(tmp_path, pin_tested=False)
    assert pip.returncode == 0, pip.stderr
    assert _would_install(tmp_path) == {"hfexport": tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]}


def test_the_seed_exact_pins_would_replace_them(tmp_path):
    """The same resolution with `torch==2.13.0`-style pins installs the tested versions over the
    user's: the check above can fail, and fails for the reason the ranges exist."""
    pip = _resolve_beside_user_stack(tmp_path, pin_tested=True)
    assert pip.returncode == 0, pip.stderr
    would_install = _would_install(tmp_path)
    assert would_install["torch"] == TESTED_VERSIONS["torch"]
    assert would_install["transformers"] == TESTED_VERSIONS["transformers"]
    assert set(would_install) == {"hfexport", *TESTED_VERSIONS}


def _readme_commands() -> list[str]:
    """The README's two install commands ("Two commands for a fresh machine"): main job, then tests."""
    section = (ROOT / "README.md").read_text().split("## Two commands for a fresh machine", 1)[1].split("\n## ", 1)[0]
    blocks = [block.split("```", 1)[0].strip() for block in section.split("```bash\n")[1:]]
    return [block for block in blocks if "pip install" in block]


def test_readme_commands_and_ci_install_the_tested_set():
    """Both README commands install with constraints.txt, and .ci/run runs the test command verbatim,
    so CI tests exactly the pinned set while pyproject.toml declares ranges."""
    commands = _readme_commands()
    assert len(commands) == 2 and all("\n" not in command for command in commands)
    for command in commands:
        assert 'pip install -q -c constraints.txt -e ".[all' in command, command
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci_lines, ".ci/run must run the README's test command verbatim"
