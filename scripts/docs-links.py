#!/usr/bin/env python3
"""Checks the manual as built (target/docs/*.html): every link and image of every page points to
a file that exists (and, for `page.html#anchor`, to an id that page has), every image is
non-empty, and every diagram the sources hold was rendered to SVG and is shown on some page.
The repository's Markdown files outside the manual (the README, the packages' and the Lambdas'
READMEs, ...) are checked too: a relative link names a file of the repository, and one into the
manual's sources (docs/src/page.md#anchor) a page and an id the built manual has.
Links leaving the site (http:, https:, mailto:) are not followed. Exits 1 naming what is wrong.

    scripts/docs-links.py [target/docs]
"""
import html.parser
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

root = Path(sys.argv[1] if len(sys.argv) > 1 else "target/docs")
diagrams = Path(__file__).resolve().parent.parent / "docs" / "diagrams"


class Page(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links, self.images, self.ids = [], [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag in ("img", "script") and a.get("src"):
            self.images.append(a["src"]) if tag == "img" else self.links.append(a["src"])
        if tag == "link" and a.get("href"):
            self.links.append(a["href"])


def parse(path: Path) -> Page:
    p = Page()
    p.feed(path.read_text(encoding="utf-8", errors="replace"))
    return p


pages = {p: parse(p) for p in sorted(root.glob("*.html"))}
if not pages:
    sys.exit(f"docs-links: no pages in {root}")
problems, shown, checked = [], set(), 0
for page, parsed in pages.items():
    for kind, refs in (("link", parsed.links), ("image", parsed.images)):
        for ref in refs:
            url = urlsplit(ref)
            if url.scheme or ref.startswith("//"):
                continue
            checked += 1
            target = (page.parent / unquote(url.path)).resolve() if url.path else page.resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                problems.append(f"{page.name}: {kind} {ref}: no {target.relative_to(root.resolve()) if target.is_relative_to(root.resolve()) else target}")
                continue
            if kind == "image":
                shown.add(target.name)
                if target.stat().st_size == 0 or (target.suffix == ".svg" and b"<svg" not in target.read_bytes()[:4096]):
                    problems.append(f"{page.name}: image {ref} is empty or not an SVG")
            if url.fragment and target.suffix == ".html" and target.parent == root.resolve():
                ids = pages[root / target.name].ids if (root / target.name) in pages else parse(target).ids
                if unquote(url.fragment) not in ids:
                    problems.append(f"{page.name}: link {ref}: {target.name} has no id {url.fragment!r}")
# The repository's other Markdown files: their relative links, and those into the manual.
repo = diagrams.parent.parent
manual_src = repo / "docs" / "src"
markdown = [p for p in repo.glob("**/*.md") if not {"node_modules", "target", ".venv", ".git", "docs", "dist"} & set(p.relative_to(repo).parts)]
for md in sorted(markdown):
    text = re.sub(r"^```.*?^```$", "", md.read_text(encoding="utf-8"), flags=re.S | re.M)
    for ref in re.findall(r"\]\(([^)\s]+)\)", text):
        url = urlsplit(ref)
        if url.scheme or ref.startswith("//") or not url.path:
            continue
        checked += 1
        target = (md.parent / unquote(url.path)).resolve()
        where = md.relative_to(repo)
        if not target.exists():
            problems.append(f"{where}: link {ref}: no such file")
        elif target.parent == manual_src.resolve() and target.suffix == ".md" and target.name != "SUMMARY.md":
            page = root / target.with_suffix(".html").name
            if not page.is_file():
                problems.append(f"{where}: link {ref}: the manual has no page {page.name}")
            elif url.fragment and unquote(url.fragment) not in (pages[page].ids if page in pages else parse(page).ids):
                problems.append(f"{where}: link {ref}: {page.name} has no id {url.fragment!r}")
for source in sorted([*diagrams.glob("*.dot"), *diagrams.glob("*.seq")]):
    svg = source.with_suffix(".svg").name
    if not (root / "diagrams" / svg).is_file():
        problems.append(f"diagram {source.name} was not rendered to diagrams/{svg}")
    elif svg not in shown:
        problems.append(f"diagram diagrams/{svg} is shown on no page")
if problems:
    print("\n".join(f"docs-links: {p}" for p in problems), file=sys.stderr)
    sys.exit(1)
print(f"docs-links: {len(pages)} pages, {checked} links and images, {len(shown)} diagrams: all found")
