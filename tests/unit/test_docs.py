"""The documentation holds together: every ``[Note: X]`` that the code base cites is defined
somewhere, docs/design.md's notes index lists every defined note with its file, and every link
in the README and docs/ (and every ``docs/...md#anchor`` or ``README.md#anchor`` cited in code)
names a file that exists and a heading that it has."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTE = re.compile(r"\[Note: ([^\]]+)\]")
# a note is defined where it opens a line (after indentation, a comment marker or a docstring's
# quotes) and nothing but its text follows on that line
DEFINITION = re.compile(r"^\s*(?:#|//|\"\"\")?\s*\[Note: ([^\]]+)\]\s*(?:$|[A-Z])")
CODE_SUFFIXES = {".py", ".h", ".cpp", ".hip", ".cu", ".sh", ".yaml", ".sbatch", ".cfg", ".toml"}
DOC_REF = re.compile(r"((?:docs/[\w.-]+\.md|README\.md)(?:#[\w-]+)?)")


def cited_notes(text: str) -> list[str]:
    """Note names cited in ``text``; a name wrapped over lines (comment markers and all) is
    joined back."""
    return [re.sub(r"\s*\n\s*(?:#|//)?\s*", " ", n) for n in NOTE.findall(text)]


def repo_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked sdist): walk it
        skip = {"build", "outputs", "multirun", "__pycache__"}  # and hidden folders (.git, caches)

        def kept(rel: Path) -> bool:
            hidden = [p for p in rel.parts[:-1] if p.startswith(".") and p != ".ci"]
            return not hidden and not any(p in skip or p.endswith(".egg-info") for p in rel.parts[:-1])

        out = [str(f.relative_to(ROOT)) for f in ROOT.rglob("*") if f.is_file() and kept(f.relative_to(ROOT))]
    here = Path(__file__).resolve()
    return [ROOT / f for f in out if (ROOT / f).is_file() and (ROOT / f).resolve() != here]


def text_files(suffixes) -> list[Path]:
    return [f for f in repo_files() if f.suffix in suffixes or f.name.endswith(".sbatch")]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    h = re.sub(r"[`*_]", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    out, fenced = set(), False
    for line in md.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def defined_notes() -> dict[str, set[str]]:
    defs: dict[str, set[str]] = {}
    for f in text_files(CODE_SUFFIXES):
        for line in f.read_text(errors="replace").splitlines():
            m = DEFINITION.match(line)
            if m:
                defs.setdefault(m.group(1), set()).add(str(f.relative_to(ROOT)))
    return defs


def test_every_cited_note_is_defined():
    defs = defined_notes()
    missing = []
    for f in text_files(CODE_SUFFIXES | {".md"}):
        for name in cited_notes(f.read_text(errors="replace")):
            if name not in defs and name != "<name>":
                missing.append(f"{f.relative_to(ROOT)}: [Note: {name}]")
    assert not missing, "cited but never defined:\n" + "\n".join(missing)


def test_notes_index_lists_every_note_with_its_file():
    defs = defined_notes()
    index = {}
    for line in (ROOT / "docs" / "design.md").read_text().splitlines():
        m = re.match(r"^\| ([^|]+?) \| `([^`]+)` \|$", line)
        if m:
            index[m.group(1)] = m.group(2)
    assert set(index) == set(defs), {
        "not in the index": sorted(set(defs) - set(index)),
        "in the index, defined nowhere": sorted(set(index) - set(defs)),
    }
    wrong = {n: (f, sorted(defs[n])) for n, f in index.items() if f not in defs[n]}
    assert not wrong, f"the index names a file that does not define the note: {wrong}"


def _check_target(src: Path, target: str) -> str | None:
    path, _, anchor = target.partition("#")
    dest = (src.parent / path).resolve() if path else src
    if not dest.exists():
        return f"{src.relative_to(ROOT)}: {target} (no such file)"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{src.relative_to(ROOT)}: {target} (no such heading)"
    return None


def test_markdown_links_resolve():
    bad = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            problem = _check_target(md, target)
            if problem:
                bad.append(problem)
    assert not bad, "\n".join(bad)


def test_code_references_to_docs_resolve():
    bad = []
    for f in text_files(CODE_SUFFIXES | {".md"}):
        for ref in DOC_REF.findall(f.read_text(errors="replace")):
            problem = _check_target(ROOT / "README.md", ref)  # paths are from the repository root
            if problem:
                bad.append(f"{f.relative_to(ROOT)}: {problem}")
    assert not bad, "\n".join(bad)


def test_no_reference_to_files_outside_the_repository():
    offenders = [
        str(f.relative_to(ROOT))
        for f in text_files(CODE_SUFFIXES | {".md"})
        if re.search(r"\bDESIGN(?:\.md)? ?§", f.read_text(errors="replace"))
    ]
    assert not offenders, offenders


def test_readme_keeps_its_two_commands_and_stays_short():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/quickstart.sh" in readme and "python -m pytest tests -q" in readme
    assert "python -m pytest -m unit tests" in readme
    assert len(readme.splitlines()) <= 200
