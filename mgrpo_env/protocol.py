"""The agents' text protocol (docs/design.md, "The agent protocol"): parse one turn, render observations.

Each turn an agent writes ``<think>...</think>`` and then exactly one action::

    <tool_call>{"name": "search", "arguments": {"queries": ["Orvel Dunmarch birth year"]}}</tool_call>
    <answer>1911</answer>          # main agent (and the single-agent baseline): the final answer
    <result>Born 1911.</result>    # sub-agent: its report back to the main agent

:func:`parse_action` turns that text into a :class:`ParsedAction` and **never raises**: a malformed
turn becomes ``kind="error"`` with a stable ``error_kind`` (see :data:`ERROR_KINDS`) and a message
written for the agent, which :func:`format_error` wraps as the next observation. The env counts
any error as a format failure and lets the episode go on.

Parsing rules (tolerant where a model's harmless habits would otherwise cost reward):

- text outside the tags and surrounding whitespace are ignored;
- ``<think>`` is optional unless ``require_think=True`` (then a missing or blank think is an error);
  a lone ``</think>`` with no opening tag is accepted (chat templates such as Qwen3's put the
  opening ``<think>`` in the prompt), and the text before it is the think;
- action tags written *inside* the think are ignored (a model may mention ``<answer>`` while thinking);
- the tool-call JSON may be wrapped in a Markdown fence (```` ```json ... ``` ````);
- tags are exact and lower-case; the closing tag must be present (engines must keep the stop
  string in the output).

Arguments are checked against the tool's JSON schema with :func:`check_arguments`, a tiny checker
for the subset our tools use (``type`` as one name or a list of names, ``properties``,
``required``, ``additionalProperties: false``, ``items``, ``minItems``/``maxItems``,
``minLength``/``maxLength``, ``minimum``/``maximum``, ``enum``). It is stricter than the tools
themselves on purpose: the schema shown in the system prompt is the format the agent is rewarded for.
The checker lives in :mod:`mgrpo_env.schema_checks`, the prompts in :mod:`mgrpo_env.prompts`; their
names are re-exported here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from mgrpo_scenarios import ChoosesRoleTools
from mgrpo_tools import schemas as tool_schemas
from mgrpo_tools.registry import Registry, UnknownName

from .prompts import FINAL_TAGS, PROMPT_STYLES, system_prompt
from .roles import ROLE_TABLE
from .schema_checks import check_arguments, signature

__all__ = [
    "require_text",
    "ERROR_KINDS",
    "FINAL_TAGS",
    "ParsedAction",
    "ToolSpec",
    "DELEGATE",
    "REASON",
    "SEARCH",
    "VISIT",
    "CLICK",
    "MAIN_TOOLS",
    "SUB_TOOLS",
    "SINGLE_TOOLS",
    "ALL_TOOLS",
    "TOOLS",
    "TOOL_FACTORIES",
    "register_tool",
    "unregister_tool",
    "DEFAULT_ROLE_TOOLS",
    "role_tools",
    "parse_action",
    "check_arguments",
    "signature",
    "format_tool_response",
    "format_error",
    "system_prompt",
    "PROMPT_STYLES",
]

Role = Literal["main", "sub", "single"]
ActionKind = Literal["tool_call", "answer", "result", "error"]

#: Stable error kinds of :func:`parse_action`, with what each means. Logs and tests key on these names.
ERROR_KINDS: Mapping[str, str] = MappingProxyType(
    {
        "too_long": "the turn is longer than max_chars characters",
        "no_tag": "none of <tool_call>, <answer>, <result> appears outside the think",
        "multiple_actions": "more than one action tag (two tool calls, or a tool call and an answer, ...)",
        "unclosed_tag": "an opening tag without its closing tag, or a closing tag without its opening",
        "bad_json": "the tool_call body is not a JSON object with a 'name' string and an 'arguments' object",
        "unknown_tool": "the tool name is not one of the role's tools",
        "bad_arguments": "the arguments do not match the tool's JSON schema",
        "wrong_final_tag": "a sub-agent wrote <answer>, or the main / single agent wrote <result>",
        "empty_final": "the <answer> or <result> is empty",
        "missing_think": "no (or a blank) <think> block while require_think is on",
    }
)


_ACTION_TAGS = ("tool_call", "answer", "result")
_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_ACTION_BLOCK = re.compile(r"<(tool_call|answer|result)>(.*?)</\1>", re.DOTALL)
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the agent sees it: a name, a one-line description and a JSON schema of its arguments.

    ``parameters`` is a JSON schema of ``type: object``. Any object with ``name``, ``description``
    and ``parameters`` attributes (e.g. an ``mgrpo_tools`` tool) can stand in for a ToolSpec.
    """

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_json(self) -> dict[str, Any]:
        """The OpenAI-style function description: ``{"name", "description", "parameters"}``."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@dataclass(frozen=True)
class ParsedAction:
    """One parsed turn.

    Attributes:
        kind: "tool_call", "answer", "result" or "error".
        think: the think text (stripped), or None when the turn had no think block.
        tool_name, arguments: set for a tool call (``arguments`` is the parsed JSON object).
        content: the stripped text of an answer or result.
        error: for kind "error", a short message for the agent (what was wrong, what is expected).
        error_kind: for kind "error", one of :data:`ERROR_KINDS`.
    """

    kind: ActionKind
    think: str | None = None
    tool_name: str | None = None
    arguments: dict[str, Any] | None = None
    content: str | None = None
    error: str | None = None
    error_kind: str | None = None

    @property
    def ok(self) -> bool:
        """True when the turn followed the protocol (the format was valid)."""
        return self.kind != "error"


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


DELEGATE = ToolSpec(
    "delegate",
    "Start a sub-agent on a self-contained subtask; its report comes back as the tool response.",
    _obj(
        {
            "task": {
                "type": "string",
                "minLength": 1,
                "description": "the subtask, stated so it can be done alone",
            },
            "context": {"type": "string", "description": "facts the sub-agent needs (optional)"},
        },
        ["task"],
    ),
)
REASON = ToolSpec(
    "reason",
    "Think through a sub-problem in depth (no web access); the reasoning comes back as the tool response.",
    _obj({"problem": {"type": "string", "minLength": 1}}, ["problem"]),
)
def _spec_of(tool: Any) -> ToolSpec:
    """The spec of a world tool (class or object): its own name, description and schema, one copy."""
    return ToolSpec(tool.name, tool.description, tool.parameters)


# the web tools as the tools package declares them (its tool classes read the same objects)
SEARCH = _spec_of(tool_schemas.SEARCH)
VISIT = _spec_of(tool_schemas.VISIT)
CLICK = _spec_of(tool_schemas.CLICK)

#: The main agent's tools (``reason`` is optional: pass a subset to drop it).
MAIN_TOOLS: Mapping[str, ToolSpec] = MappingProxyType({t.name: t for t in (DELEGATE, REASON)})
#: The sub-agent's tools (``click`` is for site traversal: pass a subset to drop it).
SUB_TOOLS: Mapping[str, ToolSpec] = MappingProxyType({t.name: t for t in (SEARCH, VISIT, CLICK)})
#: The single-agent baseline holds all of the sub-agent's tools.
SINGLE_TOOLS: Mapping[str, ToolSpec] = SUB_TOOLS
#: Every tool an agent may be shown, by name: the built-in specs and those registered with
#: :func:`register_tool`. A name a scenario's ``role_tools`` gives must be here; a bare list of names in
#: ``allowed_tools`` is checked against it.
TOOLS: Registry[ToolSpec] = Registry("tool", {t.name: t for t in (DELEGATE, REASON, SEARCH, VISIT, CLICK)})
ALL_TOOLS = TOOLS
#: ``factory(world) -> Tool`` of every registered tool: the env builds one per agent beside the world's
#: own tools (``mgrpo_env.core.WorldHandle.make_tools``). The built-in tools have none here (delegate
#: and reason are the env's, the web tools the world's).
TOOL_FACTORIES: Registry[Callable[[Any], Any]] = Registry("tool factory")
_DEFAULT_ROLE_TOOLS = {name: spec.tools for name, spec in ROLE_TABLE.items()}  # main, sub, single: their specs'
#: Each built-in role's tool names unless a scenario declares its own (``Scenario.role_tools``); a
#: registered role's are its spec's ``tools``.
DEFAULT_ROLE_TOOLS: Mapping[str, tuple[str, ...]] = MappingProxyType(_DEFAULT_ROLE_TOOLS)


def register_tool(spec: ToolSpec, factory: Callable[[Any], Any], *, roles: Collection[str] = ()) -> ToolSpec:
    """Add a tool: its spec (what the agent is shown: name, description, argument schema, checked on
    every call), ``factory(world) -> Tool`` (a fresh instance per agent, called with the running
    world) and the roles whose default tool set gets it (a scenario's own ``role_tools`` may name it
    too). A duplicate name raises ValueError. Register before an env is built."""
    unknown = [r for r in roles if r not in ROLE_TABLE]
    if unknown:
        raise ValueError(f"tool {spec.name!r}: roles {unknown} are not roles of {tuple(ROLE_TABLE)}")
    TOOLS.add(spec.name, spec)
    TOOL_FACTORIES.add(spec.name, factory)
    for role in roles:
        _DEFAULT_ROLE_TOOLS[role] = (*(_DEFAULT_ROLE_TOOLS.get(role) or ROLE_TABLE[role].tools), spec.name)
    return spec


def unregister_tool(name: str) -> None:
    """Remove a tool :func:`register_tool` added (tests and examples)."""
    if name in TOOL_FACTORIES:
        TOOLS.unregister(name)
        TOOL_FACTORIES.unregister(name)
        for role, names in _DEFAULT_ROLE_TOOLS.items():
            _DEFAULT_ROLE_TOOLS[role] = tuple(n for n in names if n != name)


def role_tools(scenario: Any, role: str, names: Sequence[str] | None = None) -> Mapping[str, ToolSpec]:
    """The specs of ``role``'s tools: ``names`` when given (a run's ``tools`` setting), else the
    scenario's ``role_tools`` mapping (role -> tool names) when it declares one, else
    :data:`DEFAULT_ROLE_TOOLS`; an unknown name raises ValueError (:func:`check_tool_names`)."""
    if names is None:
        default = DEFAULT_ROLE_TOOLS.get(role) or ROLE_TABLE[role].tools
        chosen = scenario.role_tools if isinstance(scenario, ChoosesRoleTools) else None
        names = dict(chosen or DEFAULT_ROLE_TOOLS).get(role, default)
    check_tool_names(role, names, where=f"scenario {getattr(scenario, 'name', scenario)!r}: role {role!r}")
    return MappingProxyType({n: ALL_TOOLS[n] for n in names})


def check_tool_names(role: str, names: Sequence[str], *, where: str) -> None:
    """``names`` as ``role``'s tool set: every name registered (:data:`TOOLS`), no name twice, and the
    main agent only the tools the hierarchy env runs itself (:data:`MAIN_TOOLS`) and registered
    ones (:func:`register_tool` with ``roles=("main",)``): no world tool of its own. ValueError naming ``where`` and the valid names otherwise."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{where}: a list of tool names, got {names!r}")
    for name in names:
        try:
            TOOLS.canonical(name)
        except UnknownName as exc:  # the registry's own words: the name and the valid ones
            raise ValueError(f"{where}: {exc}") from None
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: a tool named twice in {list(names)}")
    if role == "main" and any(n not in MAIN_TOOLS and n not in TOOL_FACTORIES for n in names):
        raise ValueError(f"{where}: the main agent runs only the env's own tools ({', '.join(MAIN_TOOLS)}) and "
                         f"registered ones; got {list(names)} (world tools are the sub-agents')")


# --------------------------------------------------------------------------- parsing


def _error(kind: str, message: str, think: str | None) -> ParsedAction:
    return ParsedAction(kind="error", think=think, error=message, error_kind=kind)


def _strip_fence(body: str) -> str:
    match = _FENCE.match(body)
    return match.group(1).strip() if match else body


def _names_and_specs(
    allowed_tools: Mapping[str, Any] | Collection[str],
) -> tuple[list[str], Mapping[str, Any]]:
    if isinstance(allowed_tools, Mapping):
        return list(allowed_tools), allowed_tools
    names = [allowed_tools] if isinstance(allowed_tools, str) else list(allowed_tools)
    return names, {n: ALL_TOOLS[n] for n in names if n in ALL_TOOLS}


def parse_action(
    text: str,
    *,
    role: Role,
    allowed_tools: Mapping[str, ToolSpec] | Collection[str],
    max_chars: int = 8000,
    require_think: bool = False,
) -> ParsedAction:
    """Parse one agent turn; never raises.

    Args:
        text: the decoded text the policy wrote this turn.
        role: "main" (final tag ``<answer>``), "sub" (``<result>``) or "single" (``<answer>``).
        allowed_tools: the role's tools, as name -> spec (arguments are schema-checked) or as bare
            names (checked against the built-in spec of that name when there is one, else unchecked).
        max_chars: longer turns are refused before any parsing ("too_long").
        require_think: make a missing or blank ``<think>`` an error ("missing_think").

    Returns:
        A ParsedAction; ``.ok`` is False and ``error_kind`` is one of :data:`ERROR_KINDS` on failure.

    Raises:
        ValueError: only for an unknown ``role`` (a caller bug); never because of ``text``.

    >>> parse_action('<think>x</think><answer> 42 </answer>', role="main", allowed_tools=MAIN_TOOLS).content
    '42'
    >>> parse_action('<result>hi</result>', role="main", allowed_tools=MAIN_TOOLS).error_kind
    'wrong_final_tag'
    """
    if role not in FINAL_TAGS:
        raise ValueError(f"unknown role {role!r}; expected one of {sorted(FINAL_TAGS)}")
    try:
        return _parse(text, role, allowed_tools, max_chars, require_think)
    except Exception as exc:  # noqa: BLE001 - a parse failure must never crash an episode
        return _error("bad_json", f"Could not parse the turn ({type(exc).__name__}).", None)


def _parse(
    text: str,
    role: Role,
    allowed_tools: Mapping[str, Any] | Collection[str],
    max_chars: int,
    require_think: bool,
) -> ParsedAction:
    final = FINAL_TAGS[role]
    if not isinstance(text, str):
        return _error("no_tag", f"Expected text, got {type(text).__name__}.", None)
    if len(text) > max_chars:
        return _error(
            "too_long", f"Your turn has {len(text)} characters; the limit is {max_chars}. Be shorter.", None
        )
    expected = f"<tool_call>{{...}}</tool_call> or <{final}>...</{final}>"

    # Think blocks first, so that tags mentioned while thinking are not taken as actions.
    thinks = _THINK_BLOCK.findall(text)
    rest = _THINK_BLOCK.sub(" ", text)
    if not thinks and "</think>" in rest and "<think>" not in rest:
        head, _, rest = rest.partition("</think>")  # opening <think> was in the prompt (chat template)
        thinks = [head]
    think = "\n\n".join(t.strip() for t in thinks) if thinks else None
    if "<think>" in rest or "</think>" in rest:
        return _error("unclosed_tag", "Close <think> with </think> before your action.", think)
    if require_think and not think:
        return _error("missing_think", f"Start with <think>your reasoning</think>, then {expected}.", think)

    opens = {tag: rest.count(f"<{tag}>") for tag in _ACTION_TAGS}
    closes = {tag: rest.count(f"</{tag}>") for tag in _ACTION_TAGS}
    if sum(opens.values()) > 1 or sum(closes.values()) > 1:
        return _error("multiple_actions", f"Write exactly one action per turn: {expected}.", think)
    for tag in _ACTION_TAGS:
        if opens[tag] != closes[tag]:
            missing = f"</{tag}>" if opens[tag] else f"<{tag}>"
            return _error("unclosed_tag", f"<{tag}> needs its matching {missing}.", think)
    match = _ACTION_BLOCK.search(rest)
    if match is None:
        # Balanced counts but no block means the closing tag came before the opening one.
        if any(opens.values()):
            return _error("unclosed_tag", "Write the opening tag before the closing tag.", think)
        return _error("no_tag", f"No action found. After thinking, write {expected}.", think)
    tag, body = match.group(1), match.group(2)

    if tag != "tool_call":
        if tag != final:
            return _error(
                "wrong_final_tag",
                f"As the {role} agent, finish with <{final}>...</{final}>, not <{tag}>.",
                think,
            )
        content = body.strip()
        if not content:
            return _error("empty_final", f"Your <{final}> is empty; write your {tag} inside it.", think)
        return ParsedAction(kind=tag, think=think, content=content)  # type: ignore[arg-type]
    return _parse_tool_call(body, think, allowed_tools)


def _parse_tool_call(
    body: str, think: str | None, allowed_tools: Mapping[str, Any] | Collection[str]
) -> ParsedAction:
    shape = 'Expected <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'
    try:
        call = json.loads(_strip_fence(body.strip()))
    except (ValueError, RecursionError) as exc:
        detail = f" ({exc.msg} at char {exc.pos})" if isinstance(exc, json.JSONDecodeError) else ""
        return _error("bad_json", f"The tool call is not valid JSON{detail}. {shape}.", think)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return _error("bad_json", f'The tool call needs a "name" string. {shape}.', think)
    if not isinstance(call.get("arguments"), dict):
        return _error("bad_json", f'The tool call needs an "arguments" object. {shape}.', think)
    name, arguments = call["name"], call["arguments"]
    names, specs = _names_and_specs(allowed_tools)
    if name not in names:
        available = ", ".join(names) if names else "none"
        return _error("unknown_tool", f"Unknown tool {name!r}. Available tools: {available}.", think)
    spec = specs.get(name)
    schema = getattr(spec, "parameters", None)
    if isinstance(schema, Mapping):
        problem = check_arguments(arguments, schema)
        if problem:
            return _error(
                "bad_arguments", f"Bad arguments for {name}: {problem}. Call it as {signature(spec)}.", think
            )
    return ParsedAction(kind="tool_call", think=think, tool_name=name, arguments=arguments)


# --------------------------------------------------------------------------- rendering


def format_tool_response(text: str) -> str:
    """Wrap a tool's output as the agent's next observation.

    >>> format_tool_response("3 results")
    '<tool_response>\\n3 results\\n</tool_response>'
    """
    return f"<tool_response>\n{text}\n</tool_response>"


def format_error(parsed: ParsedAction) -> str:
    """The observation for a malformed turn: ``<tool_response>Error (kind): message</tool_response>``.

    Raises ValueError when ``parsed`` is not an error (a caller bug, not an agent mistake).
    """
    if parsed.ok:
        raise ValueError("format_error needs a ParsedAction of kind 'error'")
    return format_tool_response(f"Error ({parsed.error_kind}): {parsed.error}")


def require_text(action: object, agent: str) -> str:
    """A live agent's action as given: its text. Anything else is a programming error (a forgotten
    ``decode()``, a dict of tool arguments, ``None`` for an agent that is not done), raised as a
    ``TypeError``; malformed *text* is the agent's format error and never raises.

    >>> require_text(b"<answer>x</answer>", "main_0")
    Traceback (most recent call last):
    ...
    TypeError: the action of main_0 must be a str (the agent's text), got bytes: decode() it first
    """
    if isinstance(action, str):
        return action
    hint = {bytes: ": decode() it first", bytearray: ": decode() it first",
            type(None): ": None is only for an agent that is done"}.get(type(action), "")
    raise TypeError(f"the action of {agent} must be a str (the agent's text), got {type(action).__name__}{hint}")
