"""The fuzzing session (`fuzz`): hypothesis rounds of examples, each new failure shrunk, counted
in a `FuzzSummary` and reported as a `Finding` with its reproduction."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import Any

from ..config import BUILTIN_FORMATS
from ..folder.output_folder import check_writable
from .checks import EXPORT_STAGES, run_example
from .example import ARCHS, DEFAULT_ARCHS, MODES, Example, examples
from .outcomes import Failure, Outcome
from .reproductions import replay_command, reproduction


class FuzzFailure(Exception):
    """Raised to hypothesis for a new failure; one subclass per distinct failure (`Failure.key`),
    so hypothesis shrinks each on its own."""


_FAILURE_TYPES: dict[tuple[str, ...], type[FuzzFailure]] = {}


def _part(stage: str) -> str:
    """The mode whose part of an example runs `stage`."""
    return "export" if stage in EXPORT_STAGES else "generate"


def _failure_type(key: tuple[str, ...]) -> type[FuzzFailure]:
    if key not in _FAILURE_TYPES:
        name = re.sub(r"\W", "_", f"Fuzz_{key[0]}_{key[1]}_{len(_FAILURE_TYPES)}")
        _FAILURE_TYPES[key] = type(name, (FuzzFailure,), {})
    return _FAILURE_TYPES[key]


@dataclasses.dataclass
class Finding:
    """A distinct failure and its shrunk (minimal) example."""

    key: tuple[str, ...]
    example: Example
    failure: Failure
    found_at: int  # the example that first showed it (1-based)

    def markdown(self, seed: int) -> str:
        """A Markdown section: the failure, its first lines, the reproduction and the replay command."""
        kind = f" ({self.failure.error_type})" if self.failure.error_type else ""
        return "\n".join([
            f"### {self.failure.category}{kind}: {self.example.arch} on {self.example.backend}", "",
            f"Found by `hfexport fuzz --seed {seed}` at example {self.found_at}; shrunk to `{self.example.label()}`.",
            "", "```text", self.failure.message, "```", "", "```python", reproduction(self.example, self.failure.stage)
            + "```", "", f"Replay: `{replay_command(self.example)}`", "", ""])


@dataclasses.dataclass
class FuzzOptions:
    """What `fuzz` runs: see `add_arguments` for each option."""

    examples: int = 20
    backends: tuple[str, ...] = ("dynamo",)
    archs: tuple[str, ...] = DEFAULT_ARCHS
    modes: tuple[str, ...] = MODES
    seed: int = 0
    shrink: bool = True
    shrink_budget: int = 20  # examples run while shrinking, per round
    database: str | None = None
    report: str | None = None
    progress: bool = True


@dataclasses.dataclass
class FuzzSummary:
    """Counts over the examples run (shrinking runs apart) and the distinct failures found."""

    run: int = 0
    passed: int = 0
    refused: Counter = dataclasses.field(default_factory=Counter)
    failed: Counter = dataclasses.field(default_factory=Counter)  # by category (an example may have several)
    failed_examples: int = 0
    invalid: int = 0
    shrink_runs: int = 0
    findings: dict[tuple[str, ...], Finding] = dataclasses.field(default_factory=dict)
    seconds: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # per backend

    def count(self, example: Example, outcome: Outcome) -> None:
        """Add one example run (not while shrinking) to the counts."""
        self.run += 1
        if outcome.status == "invalid":
            self.invalid += 1
            return
        self.seconds.setdefault(example.backend, []).append(outcome.seconds)
        if outcome.failures:
            self.failed_examples += 1
            self.failed.update({failure.category for failure in outcome.failures})
        elif outcome.refusals:
            self.refused.update({refusal.stage for refusal in outcome.refusals})
        else:
            self.passed += 1

    def line(self) -> str:
        """`examples run, passed, refused, failed (by category)` in one line."""
        def by(counter: Counter) -> str:
            return f" ({', '.join(f'{k} {v}' for k, v in counter.most_common())})" if counter else ""

        timing = ", ".join(f"{b} {sum(s) / len(s):.1f} s" for b, s in self.seconds.items())
        return (f"hfexport fuzz: {self.run} examples run: {self.passed} passed, {sum(self.refused.values())} refused"
                f"{by(self.refused)}, {self.failed_examples} failed{by(self.failed)}, {self.invalid} invalid; "
                f"{len(self.findings)} distinct failure(s), {self.shrink_runs} shrinking run(s); "
                f"mean per example: {timing or '-'}")


class _Session:
    """The state of one `fuzz` run across its hypothesis rounds."""

    def __init__(self, options: FuzzOptions, out: Any = sys.stdout, err: Any = sys.stderr):
        self.options, self.out, self.err = options, out, err
        self.summary = FuzzSummary()
        self.latest: dict[tuple[str, ...], Finding] = {}  # new failures of this round, last (minimal) example
        self.outcomes: dict[str, Outcome] = {}  # by example, as JSON
        self.round_shrink_runs = 0
        self.shrinking = False

    def check(self, example: Example) -> None:
        """The hypothesis test: run `example`, count it, raise for a failure not found before."""
        if self.shrinking:  # only the parts that failed: shrinking runs many candidates
            example = example.only(self._shrinking_modes())
        outcome = self.outcomes.get(example.to_json())
        if outcome is None:  # hypothesis repeats examples (each round starts with the simplest one)
            if self.shrinking and self.round_shrink_runs >= self.options.shrink_budget:
                return  # out of shrinking budget: an unseen candidate passes, so shrinking ends
            if not self.shrinking and self.summary.run >= self.options.examples:
                return  # the budget is spent: hypothesis's remaining draws pass unrun
            outcome = run_example(example)
            self._remember(example, outcome)
            self._count(example, outcome)
        new = [f for f in outcome.failures if f.key() not in self.summary.findings]
        if not new:
            return
        key = new[0].key()
        found_at = self.latest[key].found_at if key in self.latest else self.summary.run
        self.latest[key] = Finding(key, example.only([_part(new[0].stage)]), new[0], found_at)
        self.shrinking = True  # hypothesis stops generating soon after a failure, then shrinks
        raise _failure_type(key)(f"{new[0].category}: {new[0].message}")

    def _remember(self, example: Example, outcome: Outcome) -> None:
        """Keep `outcome` for `example`, and each part's share of it for the example of that part
        alone (what shrinking and hypothesis's final replay ask for)."""
        self.outcomes[example.to_json()] = outcome
        for mode in example.modes if len(example.modes) > 1 else ():
            def mine(entries: list[Failure], mode: str = mode) -> list[Failure]:
                return [entry for entry in entries if _part(entry.stage) == mode]

            part = dataclasses.replace(outcome, failures=mine(outcome.failures), refusals=mine(outcome.refusals))
            self.outcomes.setdefault(example.only([mode]).to_json(), part)

    def _shrinking_modes(self) -> set[str]:
        return {finding.example.modes[0] for finding in self.latest.values()}

    def _count(self, example: Example, outcome: Outcome) -> None:
        if self.shrinking:
            self.summary.shrink_runs += 1
            self.round_shrink_runs += 1
        else:
            self.summary.count(example, outcome)
        self._progress(example, outcome)

    def _progress(self, example: Example, outcome: Outcome) -> None:
        if not self.options.progress:
            return
        where = f"shrink {self.summary.shrink_runs}" if self.shrinking else str(self.summary.run)
        worst = outcome.failures or outcome.refusals
        detail = f": {worst[0].category}: {worst[0].message.splitlines()[0][:160]}" if worst else (
            f": {outcome.invalid}" if outcome.invalid else "")
        print(f"[{where}] {example.label()}: {outcome.status} ({outcome.seconds:.1f} s){detail}",
              file=self.err, flush=True)

    def end_round(self) -> list[Finding]:
        """Keep this round's new failures (their shrunk examples); print and report them."""
        found = list(self.latest.values())
        for finding in found:
            self.summary.findings[finding.key] = finding
            self._print_finding(finding)
        self.latest, self.shrinking, self.round_shrink_runs = {}, False, 0
        return found

    def _print_finding(self, finding: Finding) -> None:
        failure = finding.failure
        print(f"\n=== failure: {failure.category} on {finding.example.arch} ({finding.example.backend})"
              f"{', ' + failure.error_type if failure.error_type else ''}", file=self.out)
        print(failure.message, file=self.out)
        shrunk = "shrunk to" if self.options.shrink else "example"
        print(f"--- reproduction ({shrunk}: {finding.example.label()})", file=self.out)
        print(reproduction(finding.example, failure.stage), file=self.out)
        print(f"--- or: {replay_command(finding.example)}\n", file=self.out, flush=True)
        if self.options.report:
            with open(self.options.report, "a", encoding="utf-8") as report:
                report.write(finding.markdown(self.options.seed))


def _settings(options: FuzzOptions, budget: int) -> Any:
    from hypothesis import HealthCheck, Phase, Verbosity, settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if options.shrink else [])
    return settings(max_examples=budget, deadline=None, phases=phases, verbosity=Verbosity.quiet,
                    database=DirectoryBasedExampleDatabase(options.database) if options.database else None,
                    suppress_health_check=list(HealthCheck), report_multiple_bugs=True, print_blob=False)


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def _round(session: _Session, seed: int, budget: int) -> list[Finding]:
    """One hypothesis run of up to `budget` examples; it ends early, shrinking, at a new failure."""
    import hypothesis

    options = session.options

    @_settings(options, budget)
    @hypothesis.seed(seed)
    @hypothesis.given(examples(options.backends, options.archs, options.modes))
    def check(example: Example) -> None:
        session.check(example)

    try:
        check()
    except Exception as error:  # noqa: BLE001 - hypothesis re-raises the shrunk failures: they are the findings
        unexpected = [leaf for leaf in _leaves(error) if not isinstance(leaf, FuzzFailure)]
        if unexpected:
            raise unexpected[0]
    return session.end_round()


def fuzz(options: FuzzOptions, out: Any = sys.stdout, err: Any = sys.stderr) -> FuzzSummary:
    """Run `options.examples` examples (rounds of new seeds after each failure found) and return the summary."""
    _check_options(options)
    session = _Session(options, out, err)
    round_seed = options.seed
    empty_rounds = 0
    with quiet_upstream():
        while session.summary.run < options.examples and empty_rounds < _EMPTY_ROUNDS:
            before = session.summary.run
            # room for the examples hypothesis repeats (not run again); those past the budget pass unrun
            _round(session, round_seed, 2 * (options.examples - before) + 10)
            # a round can end having drawn nothing new (only examples already run, seen after a
            # failure ended the previous round early); the next seeds draw others
            empty_rounds = empty_rounds + 1 if session.summary.run == before else 0
            round_seed += 1_000_003  # the next round draws new examples (a round ends at a new failure)
    return session.summary


#: Rounds in a row that may draw no new example before `fuzz` stops short of its budget.
_EMPTY_ROUNDS = 5


def _check_options(options: FuzzOptions) -> None:
    for name, given, allowed in (("backend", options.backends, BUILTIN_FORMATS), ("mode", options.modes, MODES),
                                 ("architecture", options.archs, tuple(ARCHS))):
        wrong = [g for g in given if g not in allowed]
        if wrong or not given:
            raise ValueError(f"unknown {name} {wrong or given}; choose from {', '.join(allowed)}")
    if options.examples < 1:
        raise ValueError(f"--examples must be at least 1, got {options.examples}")
    if options.report:
        check_writable(options.report, "the fuzz report", writes="appended file", new_name="fuzz.md",
                       option="--report")
    if options.database:
        check_writable(options.database, "the example database", writes="into folder", new_name="fuzz-examples",
                       option="--database")


@contextlib.contextmanager
def quiet_upstream() -> Iterator[None]:
    """Upstream deprecation and tracing warnings off: one line per example is the fuzzer's output."""
    import logging

    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    # hfexport's warnings too: the checks judge what they warn of
    loggers = [logging.getLogger(name) for name in ("torch", "hfexport")]
    previous = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        for logger, old in zip(loggers, previous):
            logger.setLevel(old)
