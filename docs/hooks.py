"""mkdocs hooks (mkdocs.yml ``hooks:``): the generated parts of the site, and equations as MathML.

- ``<!-- mgrpo:config-reference -->``, ``<!-- mgrpo:cli-reference -->``, ``<!-- mgrpo:changelog -->``,
  ``<!-- mgrpo:demo-report -->`` and ``<!-- mgrpo:demo-table -->`` (the README's table) in a page are replaced by what docs/gen_reference.py and the demo's own
  report (``mgrpo_algo.experiments.report.markdown`` of benchmarks/results/demo_seed0/summary.json) give;
- the figures under benchmarks/results/ join the site at their repository paths, so a page shows
  ``../benchmarks/results/demo_seed0/headline.png`` and a strict build checks the link;
- ``$...$`` and ``$$...$$`` (pymdownx.arithmatex, generic mode) become MathML at build time
  (latex2mathml), which browsers draw natively: no script and nothing fetched when a page is viewed.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import gen_reference  # noqa: E402 - a sibling module, found through the line above
import gen_results  # noqa: E402

FIGURES = ("benchmarks/results",)


def demo_report(page_src: str) -> str:
    """The committed demo's report, headings one level down and its figures linked from ``page_src``."""
    from mgrpo_algo.experiments.report import markdown

    text = markdown(gen_results.load_summary())
    text = re.sub(r"^(#+) ", r"#\1 ", text, flags=re.M)
    text = re.sub(r"^## .*\n", "", text, count=1)  # the report's title: the page has its own
    up = "../" * page_src.count("/")
    return re.sub(r"\]\((\w+\.png)\)", rf"]({up}benchmarks/results/demo_seed0/\1)", text)


GENERATED = {
    "config-reference": lambda page: gen_reference.config_reference(),
    "cli-reference": lambda page: gen_reference.cli_reference(),
    "changelog": lambda page: gen_reference.changelog(),
    "demo-report": lambda page: demo_report(page.file.src_uri),
    "demo-table": lambda page: gen_results.readme_block(gen_results.load_summary()),
}


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for folder in FIGURES:
        for path in sorted((ROOT / folder).rglob("*.png")):
            files.append(File.generated(config, path.relative_to(ROOT).as_posix(), abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATED:
            raise ValueError(f"{page.file.src_uri}: unknown generated part <!-- mgrpo:{name} -->")
        return GENERATED[name](page)

    return re.sub(r"<!-- mgrpo:([\w-]+) -->", replace, markdown)


_MATH = re.compile(r'<(span|div) class="arithmatex">\\[(\[](.*?)\\[)\]]</\1>', re.S)


def on_page_content(content: str, page: Any, config: Any, files: Any) -> str:
    from latex2mathml.converter import convert

    def mathml(match: re.Match[str]) -> str:
        display = "block" if match.group(1) == "div" else "inline"
        return convert(html.unescape(match.group(2)).strip(), display=display)

    return _MATH.sub(mathml, content)
