#!/usr/bin/python3
"""Checks the references between afd's documents; exit 1 listing every broken one.

- Markdown links `[text](path#anchor)` in README.md and docs/**/*.md: a relative path must name
  an existing file or folder, and an anchor a heading of the target (GitHub's slugs).
- Section ids cited after `MODELS.md` anywhere there ("MODELS.md B3/B4", "MODELS.md A4, B5") must
  be headings of docs/MODELS.md ("### B3. ...").
- Plain mentions `docs/<name>.md` in those documents and in the comments of src/, apps/, bench/,
  scripts/ and tests/ must name an existing document, and a quoted section after one
  (`docs/<name>.md "Section"`, `docs/<name>.md, "Section"`) must begin a heading or a bold
  paragraph lead of that document.

Usage: check_links.py [REPO_ROOT] (default: two folders above this file).
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
CODE_DIRS = ["src", "apps", "bench", "scripts", "tests"]
CODE_SUFFIXES = {".h", ".cpp", ".cu", ".py", ".sh", ".txt", ".cmake", ".mjs", ".md"}

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
MENTION = re.compile(r"\bdocs/([A-Za-z0-9_-]+\.md)(?:\)?,? \"([^\"]+)\")?")
MODELS_IDS = re.compile(r"MODELS\.md\)?,?(?: \(?sections?)? \(?((?:[A-Z][0-9]?[a-z]?)(?:(?:, ?| ?/ ?|-)[A-Z][0-9]?[a-z]?)*)\b")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
BOLD_LEAD = re.compile(r"^\*\*(.+?)\*\*")


def slug(text):
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def plain(text):
    return re.sub(r"[`*]", "", text).strip().lower()


class Doc:
    def __init__(self, path):
        self.path = path
        self.anchors = set()
        self.sections = []  # plain heading texts and bold paragraph leads
        counts = {}
        fenced = False
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                continue
            m = HEADING.match(line)
            if m:
                base = slug(m.group(1))
                n = counts.get(base, 0)
                counts[base] = n + 1
                self.anchors.add(base if n == 0 else f"{base}-{n}")
                self.sections.append(plain(m.group(1)))
                continue
            m = BOLD_LEAD.match(line)
            if m:
                self.sections.append(plain(m.group(1)))

    def has_section(self, quoted):
        q = plain(quoted)
        return any(s.startswith(q) for s in self.sections)


_docs = {}


def doc(path):
    path = path.resolve()
    if path not in _docs:
        _docs[path] = Doc(path)
    return _docs[path]


def documents():
    yield ROOT / "README.md"
    yield from sorted((ROOT / "docs").rglob("*.md"))


def code_files():
    for d in CODE_DIRS:
        base = ROOT / d
        if base.is_dir():
            for p in sorted(base.rglob("*")):
                if "node_modules" in p.parts:  # npm packages the tests install, not ours
                    continue
                if p.is_file() and (p.suffix in CODE_SUFFIXES or p.name == "CMakeLists.txt"):
                    yield p


def check_mentions(path, text, errors):
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in MENTION.finditer(line):
            target = ROOT / "docs" / m.group(1)
            where = f"{path.relative_to(ROOT)}:{lineno}"
            if not target.is_file():
                errors.append(f"{where}: docs/{m.group(1)} does not exist")
            elif m.group(2) and not doc(target).has_section(m.group(2)):
                errors.append(f"{where}: docs/{m.group(1)} has no section \"{m.group(2)}\"")


def models_ids():
    ids = set()
    for line in (ROOT / "docs" / "MODELS.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^#{2,3} ([A-F][0-9]?)\. ", line)
        if m:
            ids.add(m.group(1))
    return ids


def check_models_ids(path, text, ids, errors):
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in MODELS_IDS.finditer(line):
            for cited in re.split(r"[,/ -]+", m.group(1)):
                if cited and cited.rstrip("abc") not in ids:
                    errors.append(f"{path.relative_to(ROOT)}:{lineno}: docs/MODELS.md has no section {cited}")


def check_links(path, text, errors):
    fenced = False
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part) if file_part else path
            where = f"{path.relative_to(ROOT)}:{lineno}"
            if not dest.exists():
                errors.append(f"{where}: link target {target} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in doc(dest).anchors:
                errors.append(f"{where}: {file_part or path.name} has no heading for #{anchor}")


def main():
    errors = []
    ids = models_ids()
    for p in documents():
        text = p.read_text(encoding="utf-8")
        check_links(p, text, errors)
        check_mentions(p, text, errors)
        check_models_ids(p, text, ids, errors)
    for p in code_files():
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if "docs/" in text:
            check_mentions(p, text, errors)
        if "MODELS.md" in text:
            check_models_ids(p, text, ids, errors)
    for e in errors:
        print(e)
    print(f"check_links: {len(errors)} broken reference(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
