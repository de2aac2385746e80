"""The names the README and the docs use exist: config fields (`eval.samples`, `--set main.learner.lr=...`),
`mgrpo` commands and their flags, `make` targets, Python modules and attributes (`mgrpo_env.rollout.collect`),
and repository paths (`configs/demo.yaml`). A renamed field, flag or module fails here, naming the page.
The README's demo table is the committed summary's (docs/gen_results.py)."""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

import gen_reference  # noqa: E402 - docs/ on the path above
import gen_results  # noqa: E402

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PACKAGES = ("mgrpo_algo", "mgrpo_env", "mgrpo_tools", "mgrpo_scenarios")
REPO_DIRS = ("mgrpo_algo", "mgrpo_env", "tools", "scenarios", "tests", "benchmarks", "examples", "configs", "docs")
ROLES = ("main", "sub", "single")
# fields whose value is a mapping: any key below them is the user's (scenario options, tool sets, ...)
FREE_FORM = ("scenario_kwargs", "tools", "model_sizes", "split_sizes", "loss_options", "role_epochs",
             "engine_args", "question_kinds")
CODE = re.compile(r"`([^`\n]+)`")
FENCED = re.compile(r"^[ \t]*```([\w-]*)[^\n]*\n(.*?)^[ \t]*```", re.M | re.S)
SHELL = ("bash", "sh", "console", "")


def doc_texts() -> Iterator[tuple[str, str]]:
    for path in DOCS:
        yield str(path.relative_to(ROOT)), path.read_text()


def inline_code(text: str) -> list[str]:
    return CODE.findall(FENCED.sub("", text))


def command_lines(text: str) -> list[str]:
    """Shell lines of fenced blocks (continuations joined) and inline code, that run a command."""
    lines = []
    for language, block in FENCED.findall(text):
        if language in SHELL:
            lines += block.replace("\\\n", " ").splitlines()
    lines += inline_code(text)
    return [line for line in lines if re.search(r"\b(mgrpo|make) ", line)]


@pytest.fixture(scope="module")
def fields() -> set[str]:
    from mgrpo_algo.config_doc import config_fields

    paths = {f.path.replace("[]", "") for f in config_fields()}
    return paths | {".".join(p.split(".")[:i]) for p in paths for i in range(1, p.count(".") + 1)}


def field_problem(key: str, fields: set[str]) -> str | None:
    """None when ``key`` (``main.learner.lr``, ``<role>.served.launch``, ``ROLE.generation.compact``) names
    a config field or section, or a key under a free-form mapping field; else why not."""
    key = re.sub(r"^(<role>|ROLE|<ROLE>)\.", "main.", key)
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in fields:
            return None if i == len(parts) or parts[i - 1] in FREE_FORM else f"{prefix} has no field {parts[i]!r}"
    return "no such config field"


def test_the_readme_demo_table_is_the_committed_summarys():
    assert gen_results.main(["--check"]) == 0


def test_config_fields_named_in_the_docs_exist(fields):
    first = {p.split(".")[0] for p in fields}
    sections = first - {p for p in first if "." not in p and p not in ("eval", "limits", "placement", "warm_start",
                                                                       "expert_judge", *ROLES)}
    bad = []
    for name, text in doc_texts():
        for code in inline_code(text):
            for token in re.findall(r"(?<![\w./-])((?:<role>|ROLE|[a-z_]+)(?:\.[a-z_]+)+)(?![\w/(-])", code):
                head = token.split(".")[0]
                if head in sections | {"<role>", "ROLE"} and not re.search(r"\.(py|yaml|json|md|png|jsonl|html)$", token):
                    problem = field_problem(token, fields)
                    if problem:
                        bad.append(f"{name}: `{token}`: {problem}")
    assert not bad, "\n".join(bad)


def test_set_overrides_in_commands_name_config_fields(fields):
    bad = []
    for name, text in doc_texts():
        for line in command_lines(text):
            command = re.search(r"\bmgrpo (\w[\w-]*)", line)
            for key in re.findall(r"--set[ =]['\"]?([\w.<>\[\]]+)=", line):
                if command and command.group(1) in ("serve", "serve-env"):
                    continue  # serve's and serve-env's --set keys are the scenario's options
                if command and command.group(1) == "eval" and "." not in key and field_problem(key, fields):
                    continue  # eval: a key that is not a config field is a scenario option
                problem = field_problem(key, fields)
                if problem:
                    bad.append(f"{name}: --set {key}: {problem}   ({line.strip()[:100]})")
    assert not bad, "\n".join(bad)


def test_mgrpo_commands_and_flags_in_the_docs_exist():
    from mgrpo_algo.cli import _parser

    flags = gen_reference.command_flags(_parser())
    bad = []
    for name, text in doc_texts():
        for line in command_lines(text):
            for match in re.finditer(r"(?:^|[\s/(`])mgrpo (\w[\w-]*)(.*?)(?=$|[;|&)]|\bmgrpo )", line):
                command, rest = match.groups()
                if command not in flags:
                    if not command.isupper():  # `mgrpo COMMAND` is a placeholder
                        bad.append(f"{name}: `mgrpo {command}`: no such command")
                    continue
                for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest):
                    if flag not in flags[command]:
                        bad.append(f"{name}: `mgrpo {command} {flag}`: no such flag")
    assert not bad, "\n".join(bad)


def test_make_targets_in_the_docs_exist():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    bad = [f"{name}: make {target}" for name, text in doc_texts() for line in command_lines(text)
           for target in re.findall(r"(?:^|[\s`(])make ([a-z][\w-]*)", line) if target not in targets]
    assert not bad, "\n".join(bad)


def resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted``, then walk the attributes after it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_python_names_in_the_docs_exist():
    pattern = re.compile(r"\b((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)(?![\w*{])")
    bad = []
    for name, text in doc_texts():
        for token in {t for code in CODE.findall(text) for t in pattern.findall(code)}:
            try:
                resolve(token)
            except (ImportError, AttributeError) as exc:
                bad.append(f"{name}: `{token}`: {type(exc).__name__}: {exc}")
    assert not bad, "\n".join(bad)


def test_repository_paths_in_the_docs_exist():
    pattern = re.compile(r"(?<![\w./-])((?:" + "|".join(REPO_DIRS) + r")/[\w./*{},-]*)")
    bad = []
    for name, text in doc_texts():
        for code in CODE.findall(text):
            for token in pattern.findall(code):
                if re.search(r"[<>*{]|\.\.\.|\bN\b|RUN|ROLE|benchmarks/results/quick", token):
                    continue  # a placeholder, or what a run writes
                if not (ROOT / token.rstrip(".")).exists():
                    bad.append(f"{name}: `{token}`")
    assert not bad, "\n".join(bad)


def test_the_checks_catch_a_missing_name(fields):
    """The checkers themselves: a field, a flag and a module that do not exist are reported."""
    assert field_problem("eval.samples", fields) is None and field_problem("<role>.served.launch", fields) is None
    assert field_problem("scenario_kwargs.anything", fields) is None
    assert field_problem("eval.sample", fields) and field_problem("main.learner.nope", fields)
    with pytest.raises(AttributeError):
        resolve("mgrpo_env.rollout.collect_all")
    assert callable(resolve("mgrpo_env.rollout.collect"))
