"""``mgrpo config``: every field of the config tree with its type, default and documentation.

The documentation is the field's attribute docstring in ``core/config.py`` (the string literal under
the field), read with ``ast``, so there is one place where a setting is described. Dataclasses that
document fields in an ``Attributes:`` section of the class docstring (the env's ``Limits``) are read
from there.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
import typing
from collections.abc import Iterator, Sequence
from dataclasses import MISSING, Field, fields, is_dataclass
from functools import cache
from typing import Any

__all__ = ["ConfigField", "config_fields", "field_docs", "format_fields"]


class ConfigField(typing.NamedTuple):
    """One leaf of the tree: ``path`` as ``--set`` takes it (``main.learner.lr``)."""

    path: str
    type: str
    default: Any
    doc: str


@cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` of a dataclass: the string literal right under each annotated
    field, else the field's entry in an ``Attributes:`` section of the class docstring."""
    docs: dict[str, str] = {}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (a compiled or dynamically made class)
        tree = None
    if tree is not None and isinstance(tree.body[0], ast.ClassDef):
        body = tree.body[0].body
        for node, after in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    section = re.search(r"^Attributes:\n((?:[ \t]+.*\n?|\n)+)", inspect.cleandoc(cls.__doc__ or ""), re.M)
    if section:
        for name, text in re.findall(r"^\s{4}(\w+): (.*(?:\n\s{8,}.*)*)", section.group(1), re.M):
            docs.setdefault(name, " ".join(line.strip() for line in text.splitlines()))
    return docs


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def _type_name(hint: Any) -> str:
    name = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
    return re.sub(r"\b[\w.]+\.(\w+)", r"\1", name)  # list[mgrpo_algo.core.config.StageConfig] -> list[StageConfig]


def config_fields(cls: type | None = None, prefix: str = "") -> Iterator[ConfigField]:
    """Every leaf field of ``cls`` (default: :class:`~mgrpo_algo.core.config.TrainConfig`) in
    declaration order; nested sections are walked (``main.learner.lr``), a list of sections shows its
    item's fields as ``stages[].split``."""
    if cls is None:
        from .core.config import TrainConfig

        cls = TrainConfig
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in fields(cls):
        hint, path = hints[f.name], f"{prefix}{f.name}"
        if isinstance(hint, type) and is_dataclass(hint):
            yield from config_fields(hint, f"{path}.")
            continue
        default = _default(f)
        yield ConfigField(path, _type_name(hint), default, docs.get(f.name, ""))
        if typing.get_origin(hint) is list and is_dataclass(typing.get_args(hint)[0]):
            yield from config_fields(typing.get_args(hint)[0], f"{path}[].")


def _plain(value: Any) -> str:
    """A value as YAML would take it back (JSON is YAML): 0.0001, true, null, "stage2/test", [0.9, 0.999]."""
    if value is MISSING:
        return "(required)"
    return json.dumps(value, default=lambda v: v.__dict__ if hasattr(v, "__dict__") else str(v))


def format_fields(prefixes: Sequence[str] = (), *, current: Any = None, brief: bool = False) -> str:
    """The listing ``mgrpo config`` prints: per field ``path = default  (type)`` and its doc, indented.

    ``prefixes`` keeps only the fields under them (``main.learner``, ``eval``); ``current`` (a loaded
    TrainConfig) adds the value a config file sets where it differs; ``brief``: only each doc's first line.
    """
    lines = []
    for f in config_fields():
        if prefixes and not any(f.path == p or f.path.startswith((p.rstrip(".") + ".", p + "[")) for p in prefixes):
            continue
        line = f"{f.path} = {_plain(f.default)}  ({f.type})"
        if current is not None and "[]" not in f.path:
            value = _lookup(current, f.path)
            if _plain(value) != _plain(f.default):
                line += f"  [this config: {_plain(value)}]"
        lines.append(line)
        doc = f.doc or "(undocumented)"
        text = " ".join(doc.split())
        if brief:
            text = text.split(". ")[0].rstrip(".") + "."
        lines += textwrap.wrap(text, width=100, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


def _lookup(config: Any, path: str) -> Any:
    node = config
    for part in path.split("."):
        node = getattr(node, part)
    return list(node) if isinstance(node, tuple) else node
