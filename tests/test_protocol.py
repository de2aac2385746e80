"""The text protocol: every error kind, valid actions per role, tolerance, never raising."""

import doctest
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo_env import protocol
from mgrpo_env.protocol import (
    ERROR_KINDS,
    MAIN_TOOLS,
    SINGLE_TOOLS,
    SUB_TOOLS,
    ParsedAction,
    ToolSpec,
    check_arguments,
    format_error,
    format_tool_response,
    parse_action,
    signature,
    system_prompt,
)

TOOLS = {"main": MAIN_TOOLS, "sub": SUB_TOOLS, "single": SINGLE_TOOLS}


def call(name, arguments, think="plan"):
    return (
        f"<think>{think}</think>\n<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
    )


def parse(text, role="sub", **kw):
    return parse_action(text, role=role, allowed_tools=kw.pop("allowed_tools", TOOLS[role]), **kw)


def test_doctests():
    assert doctest.testmod(protocol).failed == 0


# ----------------------------------------------------------------- valid actions


@pytest.mark.parametrize(
    ("role", "name", "arguments"),
    [
        ("main", "delegate", {"task": "Find the birth year of Orvel Dunmarch"}),
        ("main", "delegate", {"task": "Find X", "context": "X is a poet"}),
        ("main", "reason", {"problem": "Is 1911 before 1920?"}),
        ("sub", "search", {"queries": ["a"]}),
        ("sub", "search", {"queries": ["a", "b", "c"], "sites": ["example.org"]}),
        ("sub", "visit", {"url": "http://x.org/a", "goal": "birth year"}),
        ("sub", "visit", {"url": "http://x.org/a", "goal": "birth year", "page": 2}),
        ("sub", "click", {"link": 3}),
        ("sub", "click", {"link": "Velmora"}),
        ("single", "search", {"queries": ["a"]}),
    ],
)
def test_valid_tool_calls(role, name, arguments):
    p = parse(call(name, arguments), role=role)
    assert p == ParsedAction(kind="tool_call", think="plan", tool_name=name, arguments=arguments)
    assert p.ok


@pytest.mark.parametrize(("role", "tag"), [("main", "answer"), ("sub", "result"), ("single", "answer")])
def test_valid_final(role, tag):
    p = parse(f"<think> done </think><{tag}>\n 1911 \n</{tag}>", role=role)
    assert (p.kind, p.content, p.think, p.ok) == (tag, "1911", "done", True)


def test_whitespace_outside_text_and_missing_think_tolerated():
    p = parse("  \n Sure! <answer>42</answer> hope that helps \n", role="main")
    assert (p.kind, p.content, p.think) == ("answer", "42", None)


def test_lone_closing_think_from_chat_template():
    p = parse("I should search.\n</think>\n" + call("search", {"queries": ["q"]}).split("\n", 1)[1])
    assert p.ok and p.think == "I should search." and p.tool_name == "search"


def test_tags_inside_think_are_ignored():
    p = parse("<think>maybe <answer>x</answer> later</think><result>found</result>", role="sub")
    assert (p.kind, p.content) == ("result", "found")


@pytest.mark.parametrize(
    "body",
    [
        '```json\n{"name": "search", "arguments": {"queries": ["q"]}}\n```',
        '```\n{"name": "search", "arguments": {"queries": ["q"]}}\n```',
        '  ```json {"name": "search", "arguments": {"queries": ["q"]}} ```  ',
    ],
)
def test_fenced_json(body):
    p = parse(f"<tool_call>{body}</tool_call>")
    assert p.ok and p.arguments == {"queries": ["q"]}


def test_allowed_tools_as_names_and_custom_specs():
    # bare names: built-in specs still check arguments
    assert parse(call("search", {"queries": ["a"]}), allowed_tools=["search"]).ok
    assert parse(call("search", {"queries": []}), allowed_tools=["search"]).error_kind == "bad_arguments"
    assert parse(call("search", {"queries": ["a"]}), allowed_tools="search").ok
    # a name without a built-in spec is accepted unchecked
    assert parse(call("calc", {"anything": 1}), allowed_tools=["calc"]).ok
    custom = {"calc": ToolSpec("calc", "math", {"type": "object", "properties": {"x": {"type": "number"}}})}
    assert parse(call("calc", {"x": 1.5}), allowed_tools=custom).ok
    assert parse(call("calc", {"x": "1"}), allowed_tools=custom).error_kind == "bad_arguments"


# ----------------------------------------------------------------- every error kind

ERROR_CASES = [
    ("too_long", "sub", "<result>" + "x" * 9000 + "</result>"),
    ("no_tag", "sub", "<think>hmm</think> I think the answer is 4."),
    ("no_tag", "main", ""),
    ("multiple_actions", "sub", call("search", {"queries": ["a"]}) + call("search", {"queries": ["b"]})),
    ("multiple_actions", "main", call("delegate", {"task": "t"}) + "<answer>4</answer>"),
    ("multiple_actions", "main", "<answer>4</answer><answer>5</answer>"),
    ("unclosed_tag", "main", "<think>x</think><answer>4"),
    ("unclosed_tag", "main", "<think>x</think>4</answer>"),
    ("unclosed_tag", "main", "</answer>4<answer>"),
    ("unclosed_tag", "main", "<think>I will answer <answer>4</answer>"),
    ("bad_json", "sub", "<tool_call>{name: search}</tool_call>"),
    ("bad_json", "sub", '<tool_call>["search", {}]</tool_call>'),
    ("bad_json", "sub", '<tool_call>{"arguments": {"queries": ["a"]}}</tool_call>'),
    ("bad_json", "sub", '<tool_call>{"name": "search"}</tool_call>'),
    (
        "bad_json",
        "sub",
        '<tool_call>{"name": "search", "arguments": "{\\"queries\\": [\\"a\\"]}"}</tool_call>',
    ),
    ("bad_json", "sub", "<tool_call>" + "[" * 5000 + "</tool_call>"),
    ("unknown_tool", "sub", call("delegate", {"task": "t"})),
    ("unknown_tool", "main", call("search", {"queries": ["a"]})),
    ("bad_arguments", "sub", call("search", {})),
    ("bad_arguments", "sub", call("search", {"queries": "a"})),
    ("bad_arguments", "sub", call("search", {"queries": []})),
    ("bad_arguments", "sub", call("search", {"queries": ["a", "b", "c", "d"]})),
    ("bad_arguments", "sub", call("search", {"queries": ["a", 3]})),
    ("bad_arguments", "sub", call("search", {"queries": ["a"], "sites": "x.org"})),
    ("bad_arguments", "sub", call("search", {"queries": ["a"], "extra": 1})),
    ("bad_arguments", "sub", call("visit", {"url": "http://x"})),
    ("bad_arguments", "sub", call("visit", {"url": "http://x", "goal": "g", "page": "2"})),
    ("bad_arguments", "sub", call("visit", {"url": "http://x", "goal": "g", "page": 0})),
    ("bad_arguments", "sub", call("visit", {"url": "http://x", "goal": "g", "page": True})),
    ("bad_arguments", "sub", call("click", {"link": 2.5})),
    ("bad_arguments", "sub", call("click", {"link": None})),
    ("bad_arguments", "main", call("delegate", {"task": "   "})),
    ("wrong_final_tag", "sub", "<answer>4</answer>"),
    ("wrong_final_tag", "main", "<result>4</result>"),
    ("wrong_final_tag", "single", "<result>4</result>"),
    ("empty_final", "main", "<answer>  \n </answer>"),
    ("empty_final", "sub", "<think>x</think><result></result>"),
]


@pytest.mark.parametrize(("kind", "role", "text"), ERROR_CASES)
def test_error_kinds(kind, role, text):
    p = parse(text, role=role)
    assert not p.ok and p.kind == "error"
    assert p.error_kind == kind, p.error
    assert kind in ERROR_KINDS
    assert p.error and len(p.error) < 400
    assert (p.tool_name, p.arguments, p.content) == (None, None, None)
    obs = format_error(p)
    assert obs.startswith("<tool_response>") and obs.endswith("</tool_response>") and kind in obs


def test_every_error_kind_is_covered():
    covered = {k for k, _, _ in ERROR_CASES} | {"missing_think"}
    assert covered == set(ERROR_KINDS)


def test_missing_think_only_when_required():
    text = "<answer>4</answer>"
    assert parse(text, role="main").ok
    assert parse(text, role="main", require_think=True).error_kind == "missing_think"
    assert parse("<think> </think>" + text, role="main", require_think=True).error_kind == "missing_think"
    assert parse("<think>so 4</think>" + text, role="main", require_think=True).ok


def test_max_chars_boundary():
    text = "<answer>" + "x" * 10 + "</answer>"
    assert parse(text, role="main", max_chars=len(text)).ok
    assert parse(text, role="main", max_chars=len(text) - 1).error_kind == "too_long"


def test_error_messages_say_what_is_expected():
    p = parse(call("search", {"queries": ["a", "b", "c", "d"]}))
    assert "at most 3" in p.error and "search(queries: array of 1-3 strings" in p.error
    p = parse(call("open", {}))
    assert "Unknown tool 'open'" in p.error and "search, visit, click" in p.error
    p = parse("<answer>4</answer>", role="sub")
    assert "<result>" in p.error
    assert p.think is None
    p = parse("<think>t</think>nothing", role="main")
    assert p.think == "t" and "<answer>" in p.error


def test_unknown_role_is_a_caller_bug():
    with pytest.raises(ValueError, match="unknown role"):
        parse_action("<answer>x</answer>", role="boss", allowed_tools=[])


def test_non_string_text_does_not_raise():
    p = parse_action(None, role="main", allowed_tools=MAIN_TOOLS)  # type: ignore[arg-type]
    assert not p.ok


# ----------------------------------------------------------------- never raises

TOKENS = st.sampled_from(
    [
        "<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>", "<result>", "</result>",
        '{"name": "search", "arguments": {"queries": ["q"]}}', '{"name": "delegate", "arguments": {"task": "t"}}',
        "```json", "```", "{", "}", "[", "]", '"', ":", ",", " ", "\n", "x", "null", "1",
    ]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=200), st.lists(st.one_of(TOKENS, st.text(max_size=5)), max_size=30).map("".join)
    ),
    role=st.sampled_from(["main", "sub", "single"]),
    require_think=st.booleans(),
)
def test_random_text_never_raises(text, role, require_think):
    p = parse_action(text, role=role, allowed_tools=TOOLS[role], require_think=require_think, max_chars=150)
    assert isinstance(p, ParsedAction)
    assert p.ok == (p.kind != "error")
    if p.ok:
        assert p.error is None and p.error_kind is None
    else:
        assert p.error_kind in ERROR_KINDS and p.error
        format_error(p)


# ----------------------------------------------------------------- schema checker, rendering


def test_check_arguments_subset():
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "maximum": 5}, "e": {"enum": ["a", "b"]}},
    }
    assert check_arguments({"n": 5, "e": "a"}, schema) is None
    assert "<= 5" in check_arguments({"n": 6}, schema)
    assert "one of" in check_arguments({"e": "c"}, schema)
    assert "must be object" in check_arguments([], schema)
    nested = {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}
    assert "'x[1][0]'" in check_arguments([[], [3]], nested, "x")
    assert check_arguments("abc", {"type": "string", "maxLength": 2}).startswith("the arguments is too long")


def test_specs_and_signature():
    assert set(MAIN_TOOLS) == {"delegate", "reason"}
    assert set(SUB_TOOLS) == {"search", "visit", "click"}
    assert SINGLE_TOOLS == SUB_TOOLS
    assert signature(SUB_TOOLS["click"]) == "click(link: integer or string)"
    assert signature(MAIN_TOOLS["delegate"]) == "delegate(task: string, context?: string)"
    for spec in (*MAIN_TOOLS.values(), *SUB_TOOLS.values()):
        assert spec.parameters["type"] == "object"
        assert set(spec.parameters["required"]) <= set(spec.parameters["properties"])
        json.dumps(spec.to_json())
    with pytest.raises(TypeError):
        MAIN_TOOLS["x"] = MAIN_TOOLS["delegate"]  # type: ignore[index]


def test_format_tool_response_and_error():
    assert format_tool_response("hi") == "<tool_response>\nhi\n</tool_response>"
    with pytest.raises(ValueError):
        format_error(ParsedAction(kind="answer", content="4"))


@pytest.mark.parametrize("role", ["main", "sub", "single"])
def test_system_prompt(role):
    prompt = system_prompt(role, TOOLS[role])
    assert prompt == system_prompt(role, TOOLS[role])
    final = "<answer>" if role != "sub" else "<result>"
    assert final in prompt and "<think>" in prompt and "<tool_call>" in prompt and "<tool_response>" in prompt
    for name, spec in TOOLS[role].items():
        assert json.dumps(spec.to_json(), ensure_ascii=False) in prompt
        assert f'"name": "{name}"' in prompt
    with pytest.raises(ValueError):
        system_prompt("boss", {})  # type: ignore[arg-type]
