"""The site's generated pages: every config field with its default, every CLI command and flag, the
changelog. Read from the code (the config dataclasses, the argparse parser) and from git at build time,
so they cannot drift; docs/hooks.py puts them where a page has ``<!-- mgrpo:NAME -->``."""

from __future__ import annotations

import argparse
import html
import re
import subprocess
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("main", "sub", "single")


def cell(text: str) -> str:
    """Text for a table cell: one line, pipes escaped, Sphinx roles (``:class:`X` ``) as plain code."""
    return re.sub(r":\w+:`", "`", " ".join(str(text).split())).replace("|", "\\|")


def config_reference() -> str:
    """Tables of every TrainConfig field (``mgrpo_algo.config_doc``), one per top-level section; a role's
    fields (``main``, ``sub``, ``single``) once as ``<role>.…``, with each role's default where they differ."""
    from mgrpo_algo.config_doc import _plain, config_fields

    by_role: dict[str, dict[str, object]] = defaultdict(dict)
    rows: dict[str, list[tuple[str, str, str, str]]] = defaultdict(list)
    for f in config_fields():
        head, _, rest = f.path.partition(".")
        if head in ROLES and rest:
            if rest not in by_role:
                rows["<role>"].append((f"<role>.{rest}", f.type, "", f.doc))
            by_role[rest][head] = _plain(f.default)
            continue
        section = head.removesuffix("[]") if rest else "top level"
        rows[section].append((f.path, f.type, _plain(f.default), f.doc))
    role_rows = []
    for path, type_, _, doc in rows.pop("<role>"):
        defaults = by_role[path.removeprefix("<role>.")]
        shown = next(iter(defaults.values())) if len(set(defaults.values())) == 1 else "; ".join(
            f"{role}: {value}" for role, value in defaults.items())
        role_rows.append((path, type_, shown, doc))
    rows["<role> (main, sub, single)"] = role_rows
    out = [f"{sum(len(r) for r in rows.values())} fields (a role's counted once). `mgrpo config` prints the same "
           "from the same code; `mgrpo config --config FILE` adds the values a file sets.", ""]
    for section, section_rows in rows.items():
        out += [f"## `{section}`" if section != "top level" else "## Top level", "",
                "| field | type | default | what it does |", "|---|---|---|---|"]
        out += [f"| `{cell(p)}` | `{cell(t)}` | `{cell(d)}` | {cell(doc) or '(undocumented)'} |"
                for p, t, d, doc in section_rows]
        out.append("")
    return "\n".join(out)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``{name: subparser}`` of a parser built with ``add_subparsers``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_flags(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """``{command: its option strings and positional names}`` of the ``mgrpo`` parser."""
    return {name: [s for a in sub._actions for s in (a.option_strings or [a.dest])]
            for name, sub in subcommands(parser).items()}


def cli_reference() -> str:
    """Every ``mgrpo`` command with its usage and a table of its arguments (help, default)."""
    from mgrpo_algo.cli import _parser

    parser = _parser()
    helps = {a.dest: a.help for a in parser._actions if isinstance(a, argparse._SubParsersAction)
             for a in a._choices_actions}
    out = [cell(parser.description or ""), ""]
    for name, sub in subcommands(parser).items():
        usage = sub.format_usage().removeprefix("usage: ").rstrip()
        out += [f"## `mgrpo {name}`", "", cell(helps.get(name, "")), "", "```text", usage, "```", "",
                "| argument | default | what it does |", "|---|---|---|"]
        epilog = ["", "```text", sub.epilog.strip("\n"), "```"] if sub.epilog else []
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flags = ", ".join(action.option_strings) or action.dest
            default = "" if action.default in (None, argparse.SUPPRESS, [], False) else f"`{action.default}`"
            if action.required:
                default = "(required)"
            choices = f" One of: {', '.join(map(str, action.choices))}." if action.choices else ""
            out.append(f"| `{flags}` | {default} | {cell(action.help or '')}{choices} |")
        out += [*epilog, ""]
    return "\n".join(out)


_MARKDOWN_SPECIALS = re.compile(r"([\\`*_\[\]#|])")


def changelog(limit_chars: int = 300) -> str:
    """The git history, newest day first: per commit its short hash and subject line."""
    try:
        log = subprocess.run(["git", "log", "--date=short", "--format=%h%x09%ad%x09%s"], cwd=ROOT,
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "This copy has no git history (not a git checkout); the changelog is built from `git log`."
    days: dict[str, list[str]] = defaultdict(list)
    for line in log.splitlines():
        sha, day, subject = line.split("\t", 2)
        if len(subject) > limit_chars:
            subject = subject[:limit_chars].rsplit(" ", 1)[0] + " …"
        escaped = _MARKDOWN_SPECIALS.sub(r"\\\1", html.escape(subject, quote=False))
        days[day].append(f"- `{sha}` {escaped}")
    out = [f"{sum(map(len, days.values()))} commits, from `git log` at build time (subject lines; "
           "`git show HASH` has the whole message).", ""]
    for day, entries in days.items():
        out += [f"## {day}", "", *entries, ""]
    return "\n".join(out)
