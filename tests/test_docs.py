"""The documentation against the program: the CLI reference names every option the parser has and
no other, every command line the pages show parses, the README stays short, its test command is
CI's, its opening snippet runs, and every relative link leads somewhere.

Which lines are parsed: every `hfexport ...` (or `python -m hfexport ...`) command in a fenced
`bash` block of README.md and docs/, split at `&&`, `;` and `|`, its trailing `# comment` removed,
must parse as written. Synopses with placeholders and `[optional]` parts go in `text` blocks, which
are not parsed. Inline code spans in prose (`hfexport export --generate ...`) are held to less:
their command must exist and each `--option` in them must be one of that command's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from hfexport.cli.main import _parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CLI_PAGE = ROOT / "docs" / "cli.md"
PAGES = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LONG_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
INLINE_COMMAND = re.compile(r"`((?:python -m )?hfexport [^`]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _commands() -> dict[str, argparse.ArgumentParser]:
    """`{command: its parser}`, and `""` for the top-level parser (the global options)."""
    parser = _parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {"": parser, **sub.choices}


def _documented_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options a user sees in `--help`: not `-h`, not the subcommands, not a hidden alias."""
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS
            and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _all_option_strings() -> set[str]:
    return {s for p in _commands().values() for a in p._actions for s in a.option_strings}


def _cli_sections() -> dict[str, str]:
    """docs/cli.md cut at its `## ` headings: `{command: text}`, `""` for "Global options"."""
    sections = {}
    for chunk in re.split(r"^## ", CLI_PAGE.read_text(), flags=re.M)[1:]:
        heading = chunk.splitlines()[0]
        match = re.fullmatch(r"`hfexport ([\w-]+)`", heading.strip())
        if match:
            sections[match.group(1)] = chunk
        elif heading.strip() == "Global options":
            sections[""] = chunk
    return sections


def _mentions(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def test_readme_is_under_250_lines():
    lines = README.read_text().splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines: move detail to docs/"


def _undocumented(commands: dict[str, argparse.ArgumentParser], sections: dict[str, str]) -> list[str]:
    """Each command without its section, each option string and choice its section does not name."""
    missing = []
    for name, parser in commands.items():
        if name not in sections:
            missing.append(f"no section '## `hfexport {name}`'" if name else "no '## Global options'")
            continue
        for action in _documented_actions(parser):
            missing += [f"{name or 'global'}: {s}" for s in action.option_strings if not _mentions(sections[name], s)]
            missing += [f"{name or 'global'}: {action.option_strings[0]} value {c}"
                        for c in action.choices or () if not _mentions(sections[name], str(c))]
    return missing


def test_cli_reference_has_a_section_per_command_naming_each_option_and_choice():
    missing = _undocumented(_commands(), _cli_sections())
    assert not missing, "docs/cli.md lacks: " + "; ".join(missing)


def test_the_reference_check_finds_an_undocumented_option_and_choice():
    commands = _commands()
    commands["export"].add_argument("--no-such-option", choices=["first-value"])
    commands["chat"].add_argument("--format", choices=["stdin", "no-such-format"])
    assert _undocumented(commands, _cli_sections()) == [
        "export: --no-such-option", "export: --no-such-option value first-value",
        "chat: --format", "chat: --format value no-such-format"]


def test_cli_reference_names_only_options_the_parser_has():
    unknown = sorted(set(LONG_OPTION.findall(CLI_PAGE.read_text())) - _all_option_strings())
    assert not unknown, f"docs/cli.md names options no command has: {unknown}"


def _bash_commands(page: Path) -> list[str]:
    commands = []
    for lang, body in FENCE.findall(page.read_text()):
        if lang not in ("bash", "sh", "shell"):
            continue
        for line in body.splitlines():
            line = re.sub(r"\s+#.*$", "", line.strip())
            for segment in re.split(r"\s(?:&&|;|\|)\s", line):
                segment = segment.strip()
                if segment.startswith(("hfexport ", "python -m hfexport ")):
                    commands.append(segment)
    return commands


def _parse(command: str) -> str | None:
    """The error argparse gives for `command`, or None when it parses."""
    words = shlex.split(command)
    words = words[3:] if words[0] == "python" else words[1:]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            _parser().parse_args(words)
    except SystemExit:
        return stderr.getvalue().strip().splitlines()[-1]
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_line_in_a_bash_block_parses(page):
    errors = [f"{command!r}: {error}" for command in _bash_commands(page) if (error := _parse(command))]
    assert not errors, "\n".join(errors)


def test_the_pages_show_commands_to_parse():
    """The check above must be able to fail: it finds the commands it is meant to parse."""
    readme = _bash_commands(README)
    assert "hfexport export tiny:llama --format onnx -o out/tiny-llama --overwrite" in readme
    assert sum(c.startswith("hfexport generate ") and "--chat" in c for c in readme) >= 4
    assert _parse("hfexport export tiny:llama --no-such-option") is not None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_inline_commands_name_options_their_command_has(page):
    commands = _commands()
    errors = []
    for span in INLINE_COMMAND.findall(page.read_text()):
        words = span.split()
        words = words[3:] if words[0] == "python" else words[1:]
        name = next((w for w in words if not w.startswith("-")), "")
        if name not in commands:
            errors.append(f"{span!r}: no command {name!r}")
            continue
        known = {s for p in (commands[""], commands[name]) for a in p._actions for s in a.option_strings}
        errors += [f"{span!r}: {name} has no {option}" for option in LONG_OPTION.findall(span) if option not in known]
    assert not errors, "\n".join(errors)


def test_readme_test_command_is_what_ci_runs():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    blocks = [body for lang, body in FENCE.findall(README.read_text()) if lang == "bash"]
    assert any(ci[-1] in body.splitlines() for body in blocks), f"README.md does not show .ci/run's command: {ci[-1]}"


def test_readme_opening_snippet_runs():
    """The first Python block of the README, as written (a tiny Llama to torch.export, validated)."""
    snippet = next(body for lang, body in FENCE.findall(README.read_text()) if lang == "python")
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(snippet, "README.md", "exec"), namespace)
    assert namespace["report"].passed and "result: PASSED" in out.getvalue()
    assert namespace["outputs"].logits.shape[:2] == namespace["inputs"]["input_ids"].shape


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files_and_headings(page):
    broken = []
    text = FENCE.sub("", page.read_text())
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", FENCE.sub("", file.read_text()), flags=re.M)
            if anchor not in {_anchor(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_describe_the_program_not_its_history(page):
    """No word of how the project came about: the documents it started from, its issue numbers.
    Upstream bugs keep their `owner/repo#N`; a random seed (`--seed`, `seed=0`) is a seed."""
    text = page.read_text()
    found = re.findall(r"(?i)\bthe seed\b|\bseed's\b|(?<![\w/])issue \d+|\bsession \d+", text)
    if page == README:
        found += re.findall(r"(?i)\bseed", text)
    assert not found, f"{page.relative_to(ROOT)}: {found}"
