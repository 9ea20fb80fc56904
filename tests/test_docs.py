"""The README and docs/ stay a manual a clone can read: links resolve, flags are current.

- Every relative link (and `#anchor`) in README.md and docs/ must resolve to a file
  of the repository (not a git-ignored one) and, for an anchor, to a heading of that
  Markdown file; no link may leave the repository by path (`../` past the root, an
  absolute path, a `file:` URL). Links to web sites (http, https) are not fetched.
- Every docs page is listed in docs/index.md, and the README stays a front door
  (at most 200 lines).
- The flag table in docs/server.md is what scripts/gen_docs_flags.py writes from
  ServerArgs now.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200
_WEB_SCHEMES = ("http://", "https://", "mailto:")
_FENCE = re.compile(r"^\s*(```|~~~)")


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _prose_lines(text: str, blank_code: bool = True) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code spans blanked if asked."""
    out: list[tuple[int, str]] = []
    in_fence = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            if blank_code:
                line = re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line)
            out.append((number, line))
    return out


def _inline_targets(line: str) -> list[str]:
    """The targets of `[text](target "title")` links and images on one line."""
    out: list[str] = []
    for m in re.finditer(r"\]\(", line):
        depth, i = 1, m.end()
        while i < len(line) and depth:
            depth += {"(": 1, ")": -1}.get(line[i], 0)
            i += 1
        inner = line[m.end(): i - 1].strip()
        if inner.startswith("<") and ">" in inner:
            out.append(inner[1:inner.index(">")])
        elif inner:
            out.append(inner.split()[0])
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every link: inline, reference definitions, autolinks, HTML."""
    out: list[tuple[int, str]] = []
    for number, line in _prose_lines(text):
        out += [(number, t) for t in _inline_targets(line)]
        ref = re.match(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)", line)
        if ref:
            out.append((number, ref.group(1)))
        out += [(number, m.group(1)) for m in re.finditer(r"<((?:https?|file|ftp):[^>\s]+)>", line)]
        out += [(number, m.group(2)) for m in re.finditer(r"\b(href|src)=\"([^\"]+)\"", line)]
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lowercased, punctuation
    other than `-` and `_` dropped, spaces as `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a Markdown file defines: headings (duplicates get -1, -2, ...) and
    HTML `id` / `name` attributes."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(text, blank_code=False):
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    out.update(re.findall(r"\b(?:id|name)=\"([^\"]+)\"", text))
    return out


@functools.cache
def _ignored_by_git(root: Path, path: Path) -> bool:
    if not (root / ".git").exists() or shutil.which("git") is None:
        return False
    done = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", str(path)],
                          capture_output=True)
    return done.returncode == 0


def link_problems(source: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with the links of one Markdown file, one line per bad link."""
    text = source.read_text()
    where = source.relative_to(root)
    problems: list[str] = []
    for number, target in links(text):
        bad = _target_problem(source, target, root)
        if bad:
            problems.append(f"{where}:{number}: {target}: {bad}")
    return problems


def _target_problem(source: Path, target: str, root: Path) -> str | None:
    if target.startswith(_WEB_SCHEMES):
        return None
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
        return "links may point only inside the repository or to web sites"
    path_part, _, anchor = target.partition("#")
    path_part = unquote(path_part.split("?")[0])
    if path_part.startswith("/"):
        return "an absolute path: use a path relative to this file"
    dest = (source.parent / path_part).resolve() if path_part else source.resolve()
    if dest != root and root not in dest.parents:
        return "leaves the repository"
    if not dest.exists():
        return "no such file in the repository"
    if _ignored_by_git(root, dest):
        return "a git-ignored path: it is not in a clone"
    if anchor:
        if dest.suffix != ".md":
            return "an anchor into a file that is not Markdown cannot be checked"
        if anchor not in anchors(dest.read_text()):
            return f"no heading or id #{anchor} in {dest.relative_to(root)}"
    return None


# ------------------------------------------------------------------ the repository's docs


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve_inside_the_repository(path: Path) -> None:
    assert link_problems(path) == []


def test_every_docs_page_is_in_the_index() -> None:
    index = ROOT / "docs" / "index.md"
    listed = {(index.parent / t.partition("#")[0]).resolve()
              for _, t in links(index.read_text()) if not t.startswith(_WEB_SCHEMES)}
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md") if p != index}
    missing = sorted(str(p.relative_to(ROOT)) for p in pages - listed)
    assert missing == [], f"add these pages to docs/index.md: {missing}"


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; move detail into docs/ (at most {README_MAX_LINES})")
    text = "\n".join(lines)
    # The two commands the README promises (and .ci/run relies on).
    assert "bash scripts/setup.sh && .venv/bin/radixlm serve" in text
    assert "bash scripts/test.sh" in text


def _flags_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs_flags",
                                                  ROOT / "scripts" / "gen_docs_flags.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flag_table_matches_server_args() -> None:
    gen = _flags_script()
    text = gen.DOC.read_text()
    assert gen.updated(text) == text, (
        "docs/server.md's flag table is out of date: run python scripts/gen_docs_flags.py")


def test_flag_table_lists_every_flag_with_its_help() -> None:
    from radixlm.server_args import ServerArgs

    table = _flags_script().render()
    for f in dataclasses.fields(ServerArgs):
        flag = "--" + f.name.replace("_", "-")
        row = next((r for r in table.splitlines() if r.startswith(f"| `{flag}")), None)
        assert row is not None, f"{flag} is missing from the table"
        assert row.count(" | ") >= 2 and row.split(" | ")[2].strip(" |"), f"{flag} has no help"


# ------------------------------------------------------------------ the checker itself


def test_checker_finds_broken_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## Two words: here\n\n## Two words: here\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#title) [ok](docs/a.md#two-words-here-1)\n"
        "[ok](https://example.com/x) [ok](#local) <https://example.org>\n"
        "## Local\n"
        "`[in code](nowhere.md)`\n"
        "```\n[in a fence](nowhere.md)\n```\n"
        "[missing](docs/b.md)\n"
        "[bad anchor](docs/a.md#nope)\n"
        "[outside](../outside.md)\n"
        "[absolute](/etc/passwd)\n"
        "[scheme](file:///etc/passwd)\n"
        "[ref]: docs/c.md\n"
        '<img src="docs/d.png">\n'
    )
    problems = {int(p.split(":")[1]): p for p in link_problems(page, tmp_path)}
    assert sorted(problems) == [8, 9, 10, 11, 12, 13, 14], problems
    assert "no such file" in problems[8]
    assert "no heading or id #nope" in problems[9]
    assert "leaves the repository" in problems[10]
    assert "absolute path" in problems[11]
    assert "only inside the repository" in problems[12]


def test_slugs_follow_github() -> None:
    assert slug("The scheduler: one token budget") == "the-scheduler-one-token-budget"
    assert slug("`/v1/responses`") == "v1responses"
    assert slug("Using it from Python (Engine)") == "using-it-from-python-engine"
    assert slug("[Link](x.md) and snake_case") == "link-and-snake_case"
