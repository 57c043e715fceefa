"""mkdocs hooks (mkdocs.yml): the site's home page is README.md, and the
pages the guides link to outside docs/ (the benchmarks, CONTRIBUTING.md)
are pages of the site too, so that the Markdown reads the same on GitHub
and the site builds with --strict."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
# Files outside docs/ that become pages: repository path -> page.
PAGES = {
    "README.md": "index.md",
    "benchmarks/README.md": "benchmarks.md",
    "CONTRIBUTING.md": "contributing.md",
}
LINK = re.compile(r"\[([^\]]*)\]\((?!https?://|#|mailto:)([^)\s]+)\)")


def on_files(files, config):
    for source, page in PAGES.items():
        files.append(
            File.generated(config, page, content=(ROOT / source).read_text("utf-8"))
        )
    return files


def on_page_markdown(markdown, page, config, files):
    """Links as a page's source file meant them, pointed at the site's pages
    (a file of the repository that is no page is named, not linked)."""
    source = {v: k for k, v in PAGES.items()}.get(page.file.src_uri)
    page_dir = Path(page.file.src_uri).parent
    here = Path(source).parent if source else Path("docs") / page_dir

    def fix(match: re.Match) -> str:
        text = match.group(1)
        target, _, anchor = match.group(2).partition("#")
        if not target:
            return match.group(0)
        path = Path(*_resolve(here / target).parts)
        key = path.as_posix()
        if key in PAGES:
            new = PAGES[key]
        elif key.startswith("docs/") and key.endswith(".md"):
            new = key[len("docs/") :]
        else:  # a file of the repository that is no page: named, not linked
            return f"{text} (`{key}` in the repository)"
        depth = len(Path(page.file.src_uri).parent.parts)
        new = "../" * depth + new
        return f"[{text}]({new}{'#' + anchor if anchor else ''})"

    return LINK.sub(fix, markdown)


def _resolve(path: Path) -> Path:
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            parts.pop()
        elif part != ".":
            parts.append(part)
    return Path(*parts)
