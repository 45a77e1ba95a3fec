"""The repository is self-contained: no file cites a document users do not have, and doc links resolve."""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ""}
# a design file outside the repository, a parent directory's shared folder, an issue tracker entry
OUTSIDE_CITATION = re.compile(r"DESIGN\.md|\.\./shared|\bissues? #?\d+\b", re.IGNORECASE)
THIS_FILE = Path(__file__).resolve()
# the limits of a machine the project was measured on, which a user's host does not share (spelled with
# \s and [e] so that `git grep` for the words does not find this line)
TEST_MACHINE_WORDING = re.compile(r"64\sMiB|\bl[e]ase\b|minutes\sper\scommand|one\stransfer|transfer\slimit",
                                  re.IGNORECASE)


def _project_files():
    """The repository's own files: tracked or about to be (untracked but not ignored), never build output."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, listed):
        path = REPO / rel
        if path.is_file() and path.suffix in TEXT_SUFFIXES and path.resolve() != THIS_FILE:
            yield path


def _lines_matching(pattern: re.Pattern) -> list[str]:
    """`path:line: text` of every line of the project's text files that `pattern` finds something in."""
    hits = []
    for path in _project_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary fixture
        for line_no, line in enumerate(text.splitlines(), start=1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(REPO)}:{line_no}: {line.strip()}")
    return hits


def test_no_file_cites_a_document_outside_the_repository():
    hits = _lines_matching(OUTSIDE_CITATION)
    assert not hits, "citations of documents users do not have:\n" + "\n".join(hits)


def test_no_file_describes_the_limits_of_a_test_machine():
    hits = _lines_matching(TEST_MACHINE_WORDING)
    assert not hits, "the limits of a test machine, which a user's host does not share:\n" + "\n".join(hits)


MARKDOWN = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "bench").rglob("*.md")])
# a repository path cited in a `code span`: it starts at one of the repository's folders (not inside another
# path such as llm.c's dev/data/, nor after `REV:`, which names a file of an earlier commit)
CITED_PATH = re.compile(r"(?<![\w./:-])((?:bench|docs|tests|gpt2|gpt2_kernels|data|common|flows|tasks|scripts|"
                        r"\.ci)/[\w.*/-]*)")


def _anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    headings = re.findall(r"^#+ (.+)$", doc.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_doc_references_resolve(doc):
    text = doc.read_text(encoding="utf-8")
    problems = []
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        if "://" in target or ":" in target:
            continue  # a web address
        path = doc.parent / target if target else doc
        if not path.exists():
            problems.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            problems.append(f"{target}#{anchor}: no such heading")
    for named in re.findall(r"\b(docs/[\w-]+\.md)\b", text):  # docs/x.md named in prose, from the root
        if not (REPO / named).exists():
            problems.append(f"{named}: no such file")
    problems += [f"`{path}`: no such path" for path in _cited_paths(text) if not _resolves(path, doc.parent)]
    assert not problems, f"{doc.name}: {problems}"


def _cited_paths(markdown: str) -> list[str]:
    """The repository paths named in `markdown`'s code spans, outside its fenced blocks (commands there write
    paths of their own)."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return [path.rstrip(".") for span in re.findall(r"`([^`\n]+)`", prose) for path in CITED_PATH.findall(span)]


def _resolves(path: str, doc_folder: Path) -> bool:
    """A file or folder from the repository's root or the document's folder, or a glob pattern matching one."""
    return any(bool(list(base.glob(path))) if "*" in path else (base / path).exists() for base in (REPO, doc_folder))


def test_readme_links_the_reference_page():
    assert "docs/reference.md" in (REPO / "README.md").read_text(encoding="utf-8")
