"""``mgrpo view``: one static, self-contained HTML page of a run's episodes.

Reads ``RUN_DIR/episodes.jsonl`` (written by ``mgrpo eval --out`` and ``mgrpo train``) and renders
every episode as a collapsible tree: a header (question, gold and final answer, correctness,
rewards and their components, end reason, timings), the main agent's turns in order, and under each
delegation the sub-agent it started (task, context, turns with their tool calls, result, format
flag, expert score, reward; for a training run, the advantages: A_M from the records, A_S joined
from the sub side's own ``workers/<role>/advantages/<t>.json`` by the records' ``trajectory_key``).
Where the run's scenario can attribute outcomes (:mod:`mgrpo_env.attribution`), each episode carries its
outcome and the role that lost it (two filters), and its first wrong turn is marked (the delegation
that asked no needed hop, the sub-agent's wrong report or missing result, the main agent's wrong
combination) and scrolled into view when the episode opens. The page has inline CSS and a little
vanilla JS (filters, search, expand long texts) and loads nothing. All record text is untrusted model output: every string goes
through :func:`html.escape`.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from mgrpo_env.attribution import (
    LOST_BY,
    OUTCOMES,
    WrongTurn,
    attributable,
    first_wrong_turn,
    supports_attribution,
)
from mgrpo_env.episode import AgentTrajectory, EpisodeRecord, ToolCall, Turn

__all__ = ["join_sub_advantages", "load_episodes", "render_html", "write_view", "run_scenario", "wrong_turns"]

DEFAULT_MAX_EPISODES = 2000
LONG_CHARS = 600  # texts longer than this start folded behind an expand button
MAX_CHARS = 20000  # texts are cut here so that large runs stay openable
DELEGATE_LIMIT_ERROR = "Error (delegate): limit"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def load_episodes(path: str | Path, max_episodes: int = DEFAULT_MAX_EPISODES) -> tuple[list[EpisodeRecord], int]:
    """The first ``max_episodes`` records of a JSONL file and how many the file holds.

    Raises FileNotFoundError when the file is missing and ValueError naming ``file:line`` for a
    malformed line (only the kept lines are parsed; the rest are counted).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no episodes file at {path} (write one with `mgrpo eval --out DIR` or `mgrpo train`)")
    records: list[EpisodeRecord] = []
    total = 0
    with path.open(encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            total += 1
            if len(records) >= max_episodes:
                continue
            try:
                data = json.loads(line)
                if not isinstance(data, dict):
                    raise TypeError(f"expected a JSON object, got {type(data).__name__}")
                records.append(EpisodeRecord.from_dict(data))
            except Exception as exc:  # any shape error is the line's fault
                raise ValueError(f"{path}:{lineno}: not an episode record ({type(exc).__name__}: {exc})") from exc
    return records, total


def join_sub_advantages(records: list[EpisodeRecord], run_dir: Path) -> int:
    """A training run's A_S into its records' components (``advantage``, ``aligned_slots``), read from
    the worker that scored the sub side (``workers/*/advantages/<t>.json`` of the run's storage, one entry per
    aligned slot) by each record's ``trajectory_key``; returns how many slots were joined. Iterations
    whose file is gone (a run stopped before its sub side applied them) stay without A_S."""
    from ..core.scoring import annotate_sub
    from ..training.storage import RunStorage

    try:  # the workers' state is on the run's storage (placement.storage), else in the run folder
        storage = json.loads((run_dir / "config.json").read_text())["placement"]["storage"]
    except (OSError, ValueError, KeyError, TypeError):
        storage = ""
    files = RunStorage(storage or run_dir)
    by_iteration: dict[int, list[int]] = {}
    for position, record in enumerate(records):
        if record.trajectory_key:
            by_iteration.setdefault(int(record.trajectory_key["iteration"]), []).append(position)
    joined = 0
    for iteration, positions in by_iteration.items():
        at = {int(records[p].trajectory_key["index"]): p for p in positions}
        for role in sorted(files.names("workers")):
            rel = f"workers/{role}/advantages/{iteration}.json"
            try:
                slots = files.read_json(rel)
                if slots is None:
                    continue
                entries = [(at[s["index"]], s["agent"], float(s["advantage"])) for s in slots if s["index"] in at]
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{files.path(rel)}: not a sub side's advantages ({type(exc).__name__}: {exc})") from exc
            annotate_sub(records, entries)
            joined += len(entries)
    return joined


# --- small pieces -----------------------------------------------------------------------------

def _text(value: str | None, cls: str = "txt") -> str:
    """A text block; long ones fold behind an expand button, very long ones are cut."""
    if value is None:
        return '<span class="none">(none)</span>'
    value = str(value)
    cut = ""
    if len(value) > MAX_CHARS:
        cut = f"\n... [{len(value) - MAX_CHARS} more characters not shown]"
        value = value[:MAX_CHARS]
    body = f'<pre class="{cls}">{_e(value + cut)}</pre>'
    if len(value) <= LONG_CHARS and value.count("\n") < 12:
        return body
    return (f'<div class="clip"><pre class="{cls} folded">{_e(value + cut)}</pre>'
            f'<button type="button" class="more">expand ({len(value)} chars)</button></div>')


def _badge(ok: bool | None, yes: str = "ok", no: str = "error") -> str:
    if ok is None:
        return '<span class="badge">n/a</span>'
    return f'<span class="badge {"good" if ok else "bad"}">{_e(yes if ok else no)}</span>'


def _num(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _e(value)
    return _e(f"{value:.{digits}f}")


def _kv_rows(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{cells}</table>'


def _advantage(*sources: Any) -> str:
    """An advantage, when some record field carries one (trainer runs may add it); else ''."""
    for source in sources:
        if isinstance(source, dict) and source.get("advantage") is not None:
            return f' <span class="adv">advantage {_num(source["advantage"])}</span>'
    return ""


# --- tool calls, turns, agents ----------------------------------------------------------------

def _tool_call(call: ToolCall) -> str:
    status = _badge(call.ok) + (f' <span class="err">{_e(call.error)}</span>' if call.error else "")
    args = json.dumps(call.arguments, ensure_ascii=False, default=str)
    meta = " ".join(f'<span class="meta"><b>{_e(k)}</b>={_e(v)}</span>' for k, v in call.meta.items()
                    if v not in (None, "", [], {}))
    return (f'<div class="tool"><span class="toolname">{_e(call.tool)}</span> {status} '
            f'<span class="lat">{_num(call.latency_s * 1000, 1)} ms</span>'
            f'<div class="args">{_text(args, "args")}</div>'
            + (f'<div class="metas">{meta}</div>' if meta else "") + "</div>")


def _turn(turn: Turn, index: int, sub_html: str = "", agent: str = "", mark: WrongTurn | None = None) -> str:
    """Turn ``index`` (1-based) of ``agent``; the episode's first wrong turn (``mark``) carries the mark."""
    kind = _e(turn.kind) + (f" ({_e(turn.error_kind)})" if turn.error_kind else "")
    wrong = mark is not None and mark.agent == agent and mark.turn == index - 1
    flag = f' <span class="badge bad wrongmark">first wrong turn: {_e(mark.why)}</span>' if wrong else ""
    parts = [f'<div class="turnhead"><span class="idx">#{index}</span> <span class="kind k-{_e(turn.kind)}">{kind}</span>'
             f"{_advantage(turn.extra)}{flag}</div>",
             f'<div class="lbl">action</div>{_text(turn.action, "txt action")}']
    if turn.tool_call is not None:
        parts.append(_tool_call(turn.tool_call))
    parts.append(sub_html)
    if turn.observation:
        parts.append(f'<div class="lbl">observation</div>{_text(turn.observation, "txt obs")}')
    return (f'<li class="turn{" wrong" if wrong else ""}" data-agent="{_e(agent)}" data-turn="{index - 1}">'
            f'{"".join(parts)}</li>')


def _sub(sub: AgentTrajectory, components: dict[str, Any], mark: WrongTurn | None = None) -> str:
    comp = components.get(sub.agent) if isinstance(components.get(sub.agent), dict) else {}
    turns = "".join(_turn(t, i, agent=sub.agent, mark=mark) for i, t in enumerate(sub.turns, 1))
    rows = [("task", _text(sub.task, "txt task")), ("context", _text(sub.context))]
    summary = (f'<span class="agent">{_e(sub.agent)}</span> {_badge(sub.format_ok, "format ok", "format bad")} '
               f"expert {_num(sub.expert)} reward {_num(sub.reward)}{_advantage(comp)}"
               + (' <span class="badge bad">truncated</span>' if sub.truncated else "")
               + f' <span class="dim">{len(sub.turns)} turns, {sub.format_errors} format errors</span>')
    return (f'<details class="sub" open><summary>{summary}</summary>{_kv_rows(rows)}'
            f'<ol class="turns">{turns}</ol><div class="lbl">result</div>{_text(sub.final, "txt result")}</details>')


def _is_delegation(turn: Turn) -> bool:
    if turn.tool_call is not None:  # records name the sub-agent a delegation started
        return turn.tool_call.tool == "delegate" and turn.tool_call.ok
    return (turn.kind == "tool_call" and '"delegate"' in turn.action  # records written before that
            and DELEGATE_LIMIT_ERROR not in turn.observation[:80])


def _main(record: EpisodeRecord, mark: WrongTurn | None = None) -> str:
    """The main agent's turns; each delegation holds the sub-agent it started (subs are in order)."""
    subs = list(record.subs)
    items = []
    for i, turn in enumerate(record.main.turns if record.main else [], 1):
        sub_html = ""
        if subs and _is_delegation(turn):
            named = turn.tool_call.meta.get("agent") if turn.tool_call is not None else None
            match = next((s for s in subs if s.agent == named), subs[0])
            subs.remove(match)
            sub_html = _sub(match, record.components, mark)
        items.append(_turn(turn, i, sub_html, record.main.agent, mark))
    rest = "".join(_sub(s, record.components, mark) for s in subs)  # delegations that could not be matched
    if rest:
        rest = f'<div class="lbl">other sub-agents</div>{rest}'
    main = record.main
    head = ""
    if main is not None:
        comp = record.components.get(main.agent) if isinstance(record.components.get(main.agent), dict) else {}
        head = (f'<div class="mainhead"><span class="agent">{_e(main.agent)}</span> '
                f"{_badge(main.format_ok, 'format ok', 'format bad')} reward {_num(main.reward)}{_advantage(comp)} "
                f'<span class="dim">{len(main.turns)} turns, {main.format_errors} format errors</span></div>')
    return f'<section class="main">{head}<ol class="turns">{"".join(items)}</ol>{rest}</section>'


def _header(record: EpisodeRecord) -> str:
    task = record.task or {}
    rewards = ", ".join(f"{_e(a)}: {_num(r)}" for a, r in record.rewards.items()) or "(none)"
    components = json.dumps(record.components, ensure_ascii=False, default=str, indent=1)
    rows = [
        ("task id", _e(task.get("id", ""))),
        ("question", _text(task.get("question", ""), "txt question")),
        ("gold answer", _e(task.get("answer", ""))),
        ("final answer", _e(record.final_answer) if record.final_answer is not None else '<span class="none">(none)</span>'),
        ("correct", _badge(record.correct, "correct", "incorrect") + f" score {_num(record.score)}"),
        ("rewards", rewards),
        ("reward components", _text(components, "txt comp")),
        ("end reason", _e(record.end_reason) + (" (truncated)" if record.truncated else "")),
        ("wall time", f"{_num(record.wall_s, 2)} s (tools {_num(record.tool_s, 2)} s)"),
        ("episode", f"{_e(record.episode_id)} seed {_e(record.seed)}"),
    ]
    return _kv_rows(rows)


def _episode(record: EpisodeRecord, index: int, outcome: str = "", mark: WrongTurn | None = None) -> str:
    """One episode; ``outcome`` (:data:`mgrpo_env.attribution.OUTCOMES`, "" when not attributed) and the role
    that lost it are in its data attributes (the filters read them), ``mark`` its first wrong turn."""
    question = str((record.task or {}).get("question", ""))
    final = "(no answer)" if record.final_answer is None else str(record.final_answer)
    badge = '<span class="badge good">correct</span>' if record.correct else '<span class="badge bad">incorrect</span>'
    lost_by = LOST_BY.get(outcome, "")
    lost = f' <span class="badge lost">lost by {_e(lost_by)}: {_e(OUTCOME_TEXT[outcome])}</span>' if lost_by else ""
    summary = (f'<span class="idx">{index}</span> {badge}{lost} <span class="q">{_e(question[:200])}</span> '
               f'<span class="dim">-&gt; {_e(final[:80])} | {len(record.subs)} subs</span>')
    return (f'<details class="ep" data-correct="{int(bool(record.correct))}" data-outcome="{_e(outcome)}" '
            f'data-lost-by="{_e(lost_by)}" data-q="{_e(question.lower())}">'
            f"<summary>{summary}</summary>{_header(record)}{_main(record, mark)}</details>")


#: What each outcome says in an episode's badge and in the outcome filter.
OUTCOME_TEXT = {"right": "right", "no_answer": "no answer", "main_combine": "failed to combine the reports",
                "main_not_asked": "never asked a needed hop", "sub_wrong": "reported a hop wrong",
                "sub_no_result": "no result for a hop"}


# --- the page ----------------------------------------------------------------------------------

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ccc;padding:8px 16px;z-index:1}
h1{font-size:16px;margin:0 0 6px}main{padding:8px 16px}
.controls{display:flex;gap:12px;align-items:center;flex-wrap:wrap}
.note{color:#a60;margin:4px 0}
details.ep{background:#fff;border:1px solid #ddd;border-radius:4px;margin:4px 0;padding:4px 8px}
details.ep[hidden]{display:none}
details.sub{border-left:3px solid #69c;margin:6px 0 6px 8px;padding:2px 8px;background:#f4f8fc}
summary{cursor:pointer}.idx{color:#888;font-family:monospace}.dim{color:#888}.none{color:#aaa}
.badge{display:inline-block;padding:0 6px;border-radius:8px;font-size:12px;background:#eee}
.good{background:#d4f2d4;color:#174}.bad{background:#f8d7d7;color:#a12}
.adv{font-size:12px;background:#efe3ff;padding:0 5px;border-radius:6px}
table.kv{border-collapse:collapse;margin:6px 0}table.kv th{text-align:left;vertical-align:top;padding:2px 10px 2px 0;color:#555;font-weight:600;white-space:nowrap}
pre{white-space:pre-wrap;word-break:break-word;margin:2px 0;padding:4px;background:#f3f3f3;border-radius:3px;font-size:12px}
pre.folded{max-height:9em;overflow:hidden}
button.more{font-size:11px}
ol.turns{padding-left:22px}li.turn{margin:6px 0;border-top:1px dotted #ccc;padding-top:4px}
.lbl{font-size:11px;color:#777;text-transform:uppercase;margin-top:3px}
.kind{font-weight:600}.k-error{color:#a12}.k-answer,.k-result{color:#174}
.tool{background:#fff8e6;border:1px solid #f0dca8;border-radius:3px;padding:3px 6px;margin:4px 0}
.toolname{font-weight:700;font-family:monospace}.err{color:#a12}.lat{color:#666;font-size:12px}
.meta{font-size:12px;margin-right:10px;color:#555}.agent{font-weight:700}
.lost{background:#fde9c8;color:#7a4300}li.turn.wrong{border:2px solid #c33;border-radius:4px;padding:4px;background:#fff3f3}
"""

JS = """
(function(){
  var eps = Array.prototype.slice.call(document.querySelectorAll('details.ep'));
  var filter = document.getElementById('filter'), search = document.getElementById('search');
  var outcome = document.getElementById('outcome'), lostBy = document.getElementById('lost-by');
  var shown = document.getElementById('shown');
  function apply(){
    var f = filter.value, q = search.value.trim().toLowerCase(), o = outcome.value, l = lostBy.value, n = 0;
    eps.forEach(function(e){
      var ok = (f === 'all' || (f === 'correct') === (e.dataset.correct === '1')) && (!q || e.dataset.q.indexOf(q) >= 0)
        && (o === 'all' || e.dataset.outcome === o) && (l === 'all' || e.dataset.lostBy === l);
      e.hidden = !ok; if (ok) n++;
    });
    shown.textContent = n;
  }
  [filter, outcome, lostBy].forEach(function(s){ s.addEventListener('change', apply); });
  search.addEventListener('input', apply);
  // an episode opens on what went wrong: its first wrong turn scrolled into view
  eps.forEach(function(e){
    e.addEventListener('toggle', function(){
      var w = e.open && e.querySelector('li.turn.wrong');
      if (w) w.scrollIntoView({block: 'center'});
    });
  });
  document.addEventListener('click', function(ev){
    var b = ev.target;
    if (!b.classList || !b.classList.contains('more')) return;
    var pre = b.previousElementSibling, folded = pre.classList.toggle('folded');
    b.textContent = folded ? 'expand' : 'collapse';
  });
  apply();
})();
"""


def render_html(records: list[EpisodeRecord], *, title: str = "mgrpo run", total: int | None = None,
                marks: list[tuple[str, WrongTurn | None]] | None = None) -> str:
    """The whole page for ``records``; ``total`` (when larger) is how many the run holds; ``marks`` (per
    record, :func:`wrong_turns`) the outcome and first wrong turn of each, for the filters and the mark."""
    total = len(records) if total is None else total
    marks = marks or [("", None)] * len(records)
    correct = sum(bool(r.correct) for r in records)
    present = [o for o in OUTCOMES if any(outcome == o for outcome, _ in marks)]
    outcomes = "".join(f'<option value="{o}">{_e(OUTCOME_TEXT[o])}</option>' for o in present)
    note = ""
    if total > len(records):
        note = (f'<p class="note">Showing the first {len(records)} of {total} episodes '
                f"(raise the cap with --max-episodes).</p>")
    episodes = "\n".join(_episode(r, i, *marks[i - 1]) for i, r in enumerate(records, 1))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>{_e(title)}</title><style>{CSS}</style></head>
<body><header><h1>{_e(title)}</h1>
<div class="controls">
<label>show <select id="filter"><option value="all">all</option><option value="correct">correct</option>
<option value="incorrect">incorrect</option></select></label>
<label>outcome <select id="outcome"><option value="all">all</option>{outcomes}</select></label>
<label>lost by <select id="lost-by"><option value="all">any role</option><option value="main">main agent</option>
<option value="sub">sub-agents</option></select></label>
<label>search questions <input id="search" type="search" placeholder="text in the question"></label>
<span class="counts"><b id="shown">{len(records)}</b> shown of <b id="total">{len(records)}</b> episodes:
<span id="n-correct">{correct}</span> correct, <span id="n-incorrect">{len(records) - correct}</span> incorrect</span>
</div>{note}</header>
<main>
{episodes}
</main><script>{JS}</script></body></html>
"""


def run_scenario(folder: Path, name: str | None = None) -> Any:
    """The scenario whose episodes a run folder holds: ``name`` (default options) when given, else the
    ``scenario`` and ``scenario_kwargs`` of the folder's ``config.json`` (a training run's, one of compare's
    seed folders); None without either."""
    import mgrpo_scenarios

    if name:
        return mgrpo_scenarios.get(name)
    try:
        config = json.loads((folder / "config.json").read_text())
        name, kwargs = config["scenario"], dict(config.get("scenario_kwargs") or {})
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return mgrpo_scenarios.get(name, **kwargs)


def wrong_turns(records: list[EpisodeRecord], scenario: Any) -> list[tuple[str, WrongTurn | None]] | None:
    """Per record its outcome and first wrong turn (:func:`mgrpo_env.attribution.first_wrong_turn`); None when
    the scenario cannot attribute. A single-agent episode or a task without hops gets ("", None)."""
    if scenario is None or not supports_attribution(scenario):
        return None
    out: list[tuple[str, WrongTurn | None]] = []
    for record in records:
        mark = first_wrong_turn(record, scenario)  # None for a right episode and for one with nothing to attribute
        out.append((mark.outcome, mark) if mark else ("right" if attributable(record) else "", None))
    return out


def write_view(run_dir: str | Path, out: str | Path | None = None, *, max_episodes: int = DEFAULT_MAX_EPISODES,
               scenario: str | None = None) -> tuple[Path, int, int]:
    """Render ``RUN_DIR/episodes.jsonl`` (or a JSONL file given directly) to ``out``
    (default ``RUN_DIR/view.html``); returns (the page, episodes shown, episodes in the run). The outcome
    filters and the first wrong turn need the run's scenario (:func:`run_scenario`: ``scenario`` by name,
    else the folder's ``config.json``)."""
    run_dir = Path(run_dir)
    source = run_dir if run_dir.is_file() else run_dir / "episodes.jsonl"
    records, total = load_episodes(source, max_episodes)
    join_sub_advantages(records, source.parent)
    marks = wrong_turns(records, run_scenario(source.parent, scenario))
    target = Path(out) if out else source.parent / "view.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_html(records, title=f"mgrpo run: {source.parent}", total=total, marks=marks),
                      encoding="utf-8")
    return target, len(records), total
