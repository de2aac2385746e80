"""HTML-to-text: structure markers, link numbering, dropped elements, pagination."""

import pytest

from mgrpo_tools.base import ToolError
from mgrpo_tools.html_text import Document, Link, html_to_document, render_page

BASE = "http://127.0.0.1:8000/wiki/Orvel_Dunmarch"

PAGE = """<!doctype html><html><head><title>Orvel Dunmarch</title><style>p{color:red}</style>
<script>document.write("hidden")</script></head><body>
<h1>Orvel Dunmarch</h1>
<table class="infobox"><caption>Facts</caption>
<tr><th>Born in</th><td><a href="/wiki/Velmora">Velmora</a></td></tr>
<tr><th>Birth year</th><td>1911</td></tr></table>
<p>Orvel <b>Dunmarch</b> was a poet born in <a href="/wiki/Velmora#early">Velmora</a>.</p>
<h2>Works</h2>
<ul><li><a href="../wiki/The_Book">The Book</a> (1930)</li><li>Essays<ul><li>On Salt</li></ul></li></ul>
<!-- a comment --><noscript>enable js</noscript>
<a href="javascript:void(0)">js link</a> <a href="mailto:x@y.z">mail</a> <a href="#top">top</a>
<a href="https://other.example/x">Other</a>
</body></html>"""


def test_structure_and_links():
    doc = html_to_document(PAGE, BASE)
    assert doc.title == "Orvel Dunmarch"
    lines = doc.text.splitlines()
    assert lines[0] == "# Orvel Dunmarch"
    assert "Facts" in lines
    assert "Born in | Velmora [1]" in lines
    assert "Birth year | 1911" in lines
    assert "Orvel Dunmarch was a poet born in Velmora [1]." in lines  # fragment dropped, same number
    assert "## Works" in lines
    assert "- The Book [2] (1930)" in lines
    assert "- Essays" in lines and "  - On Salt" in lines
    assert "hidden" not in doc.text and "color" not in doc.text and "enable js" not in doc.text
    assert "a comment" not in doc.text
    assert doc.links == [
        Link(1, "Velmora", "http://127.0.0.1:8000/wiki/Velmora"),
        Link(2, "The Book", "http://127.0.0.1:8000/wiki/The_Book"),
        Link(3, "Other", "https://other.example/x"),
    ]
    # non-navigable hrefs keep their text and get no number
    assert "js link" in doc.text and "[4]" not in doc.text


@pytest.mark.parametrize(
    "html",
    ["", "<<<>>>", "<p>unclosed <b>bold <i>it", "\x00\x01 binary-ish", "<table><tr><td>a<td>b</table>", "<a>no href</a>"],
)
def test_malformed_markup_never_raises(html):
    doc = html_to_document(html, "http://h/")
    assert isinstance(doc, Document)
    text, pages = render_page(doc)
    assert pages == 1 and text.startswith("Title: ")


def test_title_falls_back_to_h1_and_base_tag():
    doc = html_to_document('<base href="http://other/dir/"><h1>Head</h1><a href="p">p</a>', "http://h/x")
    assert doc.title == "Head"
    assert doc.links[0].url == "http://other/dir/p"


def test_pagination_at_line_boundaries():
    paragraphs = "".join(f"<p>Paragraph number {i} " + "word " * 30 + "</p>" for i in range(60))
    doc = html_to_document(f"<title>Long</title>{paragraphs}<a href='/next'>next</a>", "http://h/")
    first, total = render_page(doc, 1, page_chars=1000)
    assert total > 5
    assert "Page 1 of" in first and "page=2" in first
    seen = []
    for page in range(1, total + 1):
        text, n = render_page(doc, page, page_chars=1000)
        assert n == total
        body = text.split("\n\n", 1)[1]
        assert len(body) <= 1000
        seen.append(body)
    joined = "\n".join(seen)
    for i in range(60):
        assert joined.count(f"Paragraph number {i} ") == 1  # nothing lost, nothing repeated
    assert "[1] next -> http://h/next" in seen[-1]
    last, _ = render_page(doc, total, page_chars=1000)
    assert "read on" not in last


def test_page_out_of_range_is_an_argument_error():
    doc = html_to_document("<p>x</p>", "http://h/")
    for bad in (0, 2, -1):
        with pytest.raises(ToolError) as err:
            render_page(doc, bad)
        assert err.value.kind == "arguments" and "between 1 and 1" in err.value.message


def test_a_single_huge_line_is_hard_split():
    doc = html_to_document("<p>" + "x" * 2500 + "</p>", "http://h/")
    _, total = render_page(doc, 1, page_chars=1000)
    assert total == 3
