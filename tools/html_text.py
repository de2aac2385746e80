"""HTML to readable text for agents: title, main text, numbered links, and pagination.

The text keeps the page's structure in plain characters a language model reads well:

* headings as ``# H1``, ``## H2``, ...;
* table rows as cells joined by `` | `` (an infobox row reads ``Born in | Velmora [3]``);
* list items as ``- item``;
* each link's anchor text followed by its number, ``Velmora [3]``; the numbers index
  :attr:`Document.links`, which ``click`` follows.

Scripts, styles and other non-content elements are dropped; what JavaScript would build is not
here (the browser mode of ``visit`` renders it first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urldefrag, urljoin

from bs4 import BeautifulSoup, NavigableString, Tag
from bs4.element import Comment, Declaration, Doctype, ProcessingInstruction

from .base import ToolError

__all__ = ["Link", "Document", "html_to_document", "render_page"]

_DROP = ["script", "style", "noscript", "template", "svg", "iframe", "object", "embed", "canvas", "head"]
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_BLOCKS = {
    "p", "div", "section", "article", "main", "header", "footer", "aside", "nav", "blockquote",
    "figure", "figcaption", "form", "fieldset", "dl", "dt", "dd", "address", "details", "summary", "body", "html",
}
_SKIP_STRINGS = (Comment, Declaration, Doctype, ProcessingInstruction)
_WS = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT = re.compile(r" +([.,;:!?)\]])")
_SPACE_AFTER_OPEN = re.compile(r"([(\[]) +")


@dataclass(frozen=True)
class Link:
    """A numbered link of a page: ``number`` is what the agent passes to ``click``."""

    number: int
    text: str
    url: str


@dataclass
class Document:
    """A page made readable: absolute ``url``, ``title``, structured ``text`` and its ``links``."""

    url: str
    title: str
    text: str
    links: list[Link] = field(default_factory=list)


class _Renderer:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.lines: list[str] = []
        self.buf: list[str] = []
        self.links: list[Link] = []
        self._numbers: dict[str, int] = {}

    def link_marker(self, tag: Tag, text: str) -> str:
        href = (tag.get("href") or "").strip()
        if not href or href.startswith(("#", "javascript:", "mailto:", "tel:", "data:")):
            return text
        url = urldefrag(urljoin(self.base_url, href))[0]
        if not url.startswith(("http://", "https://")):
            return text
        number = self._numbers.get(url)
        if number is None:
            number = len(self.links) + 1
            self._numbers[url] = number
            self.links.append(Link(number, text or url, url))
        return f"{text} [{number}]" if text else f"[{number}]"

    def inline(self, node: Tag) -> str:
        """The collapsed text of ``node`` with link markers, ignoring block structure."""
        parts: list[str] = []
        for child in node.children:
            if isinstance(child, NavigableString):
                if not isinstance(child, _SKIP_STRINGS):
                    parts.append(str(child))
            elif isinstance(child, Tag):
                if child.name == "a":
                    parts.append(" " + self.link_marker(child, _collapse(self.inline(child))) + " ")
                elif child.name == "br":
                    parts.append(" ")
                elif child.name == "img":
                    alt = (child.get("alt") or "").strip()
                    if alt:
                        parts.append(f" {alt} ")
                else:
                    parts.append(self.inline(child))
                    if child.name in _BLOCKS or child.name in ("li", "td", "th", "tr"):
                        parts.append(" ")
        return _collapse("".join(parts))

    def flush(self) -> None:
        line = _collapse("".join(self.buf))
        if line:
            self.lines.append(line)
        self.buf = []

    def walk(self, node: Tag, depth: int = 0) -> None:
        for child in node.children:
            if isinstance(child, NavigableString):
                if not isinstance(child, _SKIP_STRINGS):
                    self.buf.append(str(child))
                continue
            if not isinstance(child, Tag):
                continue
            name = child.name
            if name in _HEADINGS:
                self.flush()
                text = self.inline(child)
                if text:
                    self.lines.append("")
                    self.lines.append("#" * _HEADINGS[name] + " " + text)
            elif name == "a":
                self.buf.append(" " + self.link_marker(child, _collapse(self.inline(child))) + " ")
            elif name == "br":
                self.flush()
            elif name in ("ul", "ol", "menu"):
                self.flush()
                self.walk_list(child, depth)
            elif name == "table":
                self.flush()
                self.walk_table(child)
            elif name == "pre":
                self.flush()
                text = child.get_text()
                self.lines.extend(line.rstrip() for line in text.strip("\n").splitlines())
            elif name == "hr":
                self.flush()
            elif name == "img":
                alt = (child.get("alt") or "").strip()
                if alt:
                    self.buf.append(f" {alt} ")
            elif name in _BLOCKS or name in ("li", "tr", "td", "th"):
                self.flush()
                self.walk(child, depth)
                self.flush()
            else:  # inline element: span, b, em, code, ...
                self.walk(child, depth)

    def walk_list(self, node: Tag, depth: int) -> None:
        for item in node.find_all("li", recursive=False):
            nested = [c for c in item.children if isinstance(c, Tag) and c.name in ("ul", "ol")]
            for sub in nested:
                sub.extract()
            text = self.inline(item)
            if text:
                self.lines.append("  " * depth + "- " + text)
            for sub in nested:
                self.walk_list(sub, depth + 1)

    def walk_table(self, table: Tag) -> None:
        caption = table.find("caption")
        if caption is not None:
            text = self.inline(caption)
            if text:
                self.lines.append(text)
        for row in table.find_all("tr"):
            if row.find_parent("table") is not table:
                continue  # rows of a nested table are rendered inside their cell's text
            cells = [self.inline(c) for c in row.find_all(["th", "td"], recursive=False)]
            cells = [c for c in cells if c]
            if cells:
                self.lines.append(" | ".join(cells))


def _collapse(text: str) -> str:
    # link markers are padded with spaces; do not leave "Velmora [1] ." behind
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", _WS.sub(" ", text))
    return _SPACE_AFTER_OPEN.sub(r"\1", text).strip()


def html_to_document(html: str, base_url: str) -> Document:
    """Parse ``html`` (fetched from ``base_url``) into a :class:`Document`.

    Never raises on malformed markup: the lxml parser repairs what it can and keeps the rest.
    """
    soup = BeautifulSoup(html, "lxml")
    title = _collapse(soup.title.get_text(" ")) if soup.title else ""
    base_tag = soup.find("base", href=True)
    if base_tag is not None:
        base_url = urljoin(base_url, base_tag["href"])
    for tag in soup(_DROP):
        tag.decompose()
    if not title:
        h1 = soup.find("h1")
        title = _collapse(h1.get_text(" ")) if h1 else ""
    renderer = _Renderer(base_url)
    root = soup.body or soup
    renderer.walk(root)
    renderer.flush()
    lines: list[str] = []
    for line in renderer.lines:
        if line == "" and (not lines or lines[-1] == ""):
            continue  # no leading or doubled blank lines
        lines.append(line)
    return Document(url=base_url, title=title, text="\n".join(lines).strip(), links=renderer.links)


def _chunks(text: str, size: int) -> list[str]:
    """Split at line boundaries into pieces of at most ``size`` characters (hard-split longer lines)."""
    chunks: list[str] = []
    current = ""
    for line in text.split("\n"):
        while len(line) > size:
            if current:
                chunks.append(current)
                current = ""
            chunks.append(line[:size])
            line = line[size:]
        candidate = f"{current}\n{line}" if current else line
        if len(candidate) > size:
            chunks.append(current)
            current = line
        else:
            current = candidate
    if current or not chunks:
        chunks.append(current)
    return chunks


_LINK_MARKER = re.compile(r" ?\[\d+\]")
_WORD = re.compile(r"[^\W_]+")
# Function words say nothing about which line answers a goal ("population of X" must not prefer
# prose that says "of" twice over the row "Population | 328,668").
_STOP_WORDS = frozenset(["a", "an", "and", "at", "by", "for", "from", "in", "is", "of", "on", "or", "the", "to", "was", "what", "when", "where", "which", "who", "how"])


def strip_link_markers(text: str) -> str:
    """``text`` without the `` [n]`` link numbers that :func:`html_to_document` puts after anchors."""
    return _LINK_MARKER.sub("", text)


def relevant_lines(doc: Document, goal: str, n: int) -> list[str]:
    """The ``n`` lines of ``doc``'s text that match ``goal`` best (BM25 over the page's lines), best first.

    Deep-research agents' visit tools return the evidence relevant to the visit's goal rather than a
    raw page; this is the cheapest honest version of that. Words of the page's title are not
    evidence (every line of a page is about its subject), nor are function words, ``_`` separates
    words (``born_in`` matches ``Born in``), and lines that match no goal word are never returned. Link markers are removed.
    """
    from rank_bm25 import BM25Okapi

    def words(text: str) -> list[str]:
        return [w.lower() for w in _WORD.findall(text)]

    lines = [strip_link_markers(line).strip() for line in doc.text.split("\n")]
    lines = [line for line in lines if line and not line.startswith("#")]
    title = set(words(doc.title))
    query = [w for w in words(goal) if w not in title and w not in _STOP_WORDS]
    if not lines or not query or n < 1:
        return []
    bm25 = BM25Okapi([words(line) or ["_"] for line in lines])
    scores = bm25.get_scores(query)
    ranked = sorted(range(len(lines)), key=lambda i: (-scores[i], i))
    wanted = set(query)
    return [lines[i] for i in ranked[:n] if scores[i] > 0 and wanted & set(words(lines[i]))]


def render_page(doc: Document, page: int = 1, page_chars: int = 4000, *, links: bool = True) -> tuple[str, int]:
    """The agent-facing text of page ``page`` of ``doc``, and the number of pages.

    The full text is the readable main text followed by the numbered ``Links:`` list; it is cut at
    line boundaries into pages of at most ``page_chars`` characters. A header gives the title, the
    URL and the page position, and says how to read on. ``links=False`` leaves out the link numbers
    and the ``Links:`` list (compact pages for small models; ``click`` by anchor text still works).

    Raises:
        ToolError("arguments"): ``page`` is not between 1 and the number of pages.
    """
    if page_chars < 200:
        raise ValueError("page_chars must be at least 200")
    body = (doc.text if links else strip_link_markers(doc.text)) or "(no readable text on this page)"
    if doc.links and links:
        body += "\n\nLinks:\n" + "\n".join(f"[{link.number}] {link.text} -> {link.url}" for link in doc.links)
    pages = _chunks(body, page_chars)
    total = len(pages)
    if not 1 <= page <= total:
        raise ToolError("arguments", f"page must be between 1 and {total} for {doc.url}, got {page}")
    position = f"Page {page} of {total}"
    if page < total:
        position += f" (call visit with page={page + 1} to read on)"
    header = f"Title: {doc.title or '(untitled)'}\nURL: {doc.url}\n{position}\n\n"
    return header + pages[page - 1].strip("\n"), total
