#!/usr/bin/env python3
"""Fails when a link in the docs, or a docs/results path named in a source comment, does not resolve.

usage: docs_links.py REPO_ROOT      (exit 0: every link resolves; 1: each broken one printed)
       docs_links.py --self-test    (checks that a broken file link and a broken #anchor are caught)
       docs_links.py --policies ALLOCSHIM REPO_ROOT
                                    (every ```toml block of README.md and docs/ is a policy that
                                     `ALLOCSHIM check` accepts: the examples a reader copies work)

Checked: every relative Markdown link [text](target) and <img src> in README.md, docs/ (all
levels), the benchmark and example READMEs and every kept results record (Markdown under a
results/ folder): the file or folder must exist, and a #anchor must be a heading of the target
Markdown file (GitHub's slugs). Source files under
shim/, policy/, tools/, tests/ and examples/ that name docs/*.md or a results path must name one
that exists, and a section they name (docs/X.md, "Title") must be a heading there. Web links
are not fetched (CI has no network).
"""
import os
import re
import subprocess
import sys
import tempfile

DOC_FILES = ["README.md", "CHANGELOG.md", "tools/bench/README.md", "examples/README.md",
             "tools/bench/results/README.md", "tests/gpu/results/README.md"]
DOC_DIRS = ["docs"]
SOURCE_DIRS = ["shim", "policy", "tools", "tests", "examples"]
SOURCE_EXT = (".cpp", ".h", ".c", ".cu", ".def", ".py", ".sh", ".txt", ".cmake", ".S")
# Folders whose files are records of past runs: a path in their text may name a run since deleted
# (git history), but their Markdown links, like the docs', must resolve.
SKIP_SOURCE_DIRS = ("tools/bench/results", "tests/gpu/results", "tests/package/results",
                    "tests/trace/results", "tests/unit/results")

LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMG = re.compile(r"<img[^>]*\ssrc=\"([^\"]+)\"")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# A source comment naming a section: docs/X.md, "Title" (a comment may wrap between the two).
SECTION_IN_SOURCE = re.compile(r'(docs/[\w/.-]+\.md),\s*"([^"]+)"')
PATH_IN_SOURCE = re.compile(r"(?<![\w/.-])((?:docs/[\w./-]+\.md)|(?:(?:tools/bench|tests/gpu)/results/[\w.-]+(?:/[\w.-]+)*))")


def slug(heading):
    """GitHub's anchor for a heading: text only, lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def strip_code(lines):
    """The lines outside fenced code blocks, numbered from 1, inline code spans blanked."""
    fenced = False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), line)


def anchors(path, cache={}):
    """The #anchors a Markdown file's headings make (outside code blocks; repeats get -1, -2...)."""
    if path not in cache:
        seen, found, fenced = {}, set(), False
        with open(path, encoding="utf-8") as f:
            for line in f.read().splitlines():
                if FENCE.match(line):
                    fenced = not fenced
                    continue
                m = None if fenced else HEADING.match(line)
                if m:
                    base = slug(m.group(2))
                    found.add(f"{base}-{seen[base]}" if base in seen else base)
                    seen[base] = seen.get(base, 0) + 1
        cache[path] = found
    return cache[path]


def check_link(root, doc, number, target, problems):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
        return  # http:, https:, mailto: ...
    path, _, anchor = target.partition("#")
    full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
    where = f"{os.path.relpath(doc, root)}:{number}"
    if not os.path.exists(full):
        problems.append(f"{where}: {target}: no such file")
        return
    if anchor and full.endswith(".md") and anchor not in anchors(full):
        problems.append(f"{where}: {target}: no heading #{anchor} in {os.path.relpath(full, root)}")


def check_markdown(root, doc, problems):
    with open(doc, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for number, line in strip_code(lines):
        for m in LINK.finditer(line):
            check_link(root, doc, number, m.group(3), problems)
        for m in IMG.finditer(line):
            check_link(root, doc, number, m.group(1), problems)


def check_sources(root, problems):
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            rel = os.path.relpath(dirpath, root)
            if rel.startswith(SKIP_SOURCE_DIRS):
                dirnames[:] = []
                continue
            for name in filenames:
                if not name.endswith(SOURCE_EXT) or name == "docs_links.py":
                    continue
                path = os.path.join(dirpath, name)
                try:
                    with open(path, encoding="utf-8") as f:
                        text = f.read()
                except (UnicodeDecodeError, OSError):
                    continue
                for number, line in enumerate(text.splitlines(), 1):
                    for m in PATH_IN_SOURCE.finditer(line):
                        named = m.group(1).rstrip(".")
                        if not os.path.exists(os.path.join(root, named)):
                            problems.append(f"{os.path.relpath(path, root)}:{number}: {named}: no such file")
                # Comment continuations joined, so a reference that wraps is still one.
                flat = re.sub(r"\n\s*(?://|#)\s*", " ", text).replace("docs/ ", "docs/")
                for m in SECTION_IN_SOURCE.finditer(flat):
                    doc, title = os.path.join(root, m.group(1)), m.group(2)
                    if not os.path.exists(doc):
                        continue  # reported above
                    # A title may be the start of a longer heading ("Migration" for
                    # "Migration (`migrate = ...`)").
                    if not any(a.startswith(slug(title)) for a in anchors(doc)):
                        problems.append(f"{os.path.relpath(path, root)}: {m.group(1)}, \"{title}\": no such section")


def check(root):
    problems = []
    for doc in doc_files(root):
        check_markdown(root, doc, problems)
    check_sources(root, problems)
    return problems


def markdown_under(root, dirs):
    files = []
    for d in dirs:
        for dirpath, _, filenames in os.walk(os.path.join(root, d)):
            files += [os.path.join(dirpath, n) for n in sorted(filenames) if n.endswith(".md")]
    return files


def docs_dir_files(root):
    return markdown_under(root, DOC_DIRS)


def result_files(root):
    """The kept records of runs (Markdown), whose links a reader follows as the docs'."""
    return markdown_under(root, SKIP_SOURCE_DIRS)


def doc_files(root):
    files = [os.path.join(root, f) for f in DOC_FILES if os.path.exists(os.path.join(root, f))]
    files += docs_dir_files(root)
    return files + [f for f in result_files(root) if f not in files]


def check_policies(allocshim, root):
    """Each ```toml block of README.md and docs/, checked by `allocshim check`."""
    problems, checked = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for doc in [os.path.join(root, "README.md")] + docs_dir_files(root):
            block, start = None, 0
            with open(doc, encoding="utf-8") as f:
                for number, line in enumerate(f.read().splitlines(), 1):
                    if block is None and line.strip() == "```toml":
                        block, start = [], number + 1
                    elif block is not None and line.strip().startswith("```"):
                        path = os.path.join(tmp, "policy.toml")
                        with open(path, "w") as out:
                            out.write("\n".join(block) + "\n")
                        p = subprocess.run([allocshim, "check", path], capture_output=True, text=True)
                        checked += 1
                        if p.returncode != 0:
                            problems.append(f"{os.path.relpath(doc, root)}:{start}: the policy does not check: "
                                            + p.stderr.strip().replace(path, "block"))
                        block = None
                    elif block is not None:
                        block.append(line)
    return problems, checked


def self_test():
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs"))
        os.makedirs(os.path.join(root, "shim"))
        with open(os.path.join(root, "docs", "guide.md"), "w") as f:
            f.write("# Guide\n\n## The `host` kind (spill)\n\n```\n[not](a-link.md)\n```\n")
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("[ok](docs/guide.md#the-host-kind-spill) [ok](#readme)\n# Readme\n")
        assert check(root) == [], check(root)
        with open(os.path.join(root, "README.md"), "a") as f:
            f.write("[gone](docs/missing.md) [bad anchor](docs/guide.md#no-such-heading)\n")
        with open(os.path.join(root, "shim", "x.h"), "w") as f:
            f.write('// see docs/nowhere.md\n// (docs/guide.md, "The `host`\n// kind") (docs/guide.md, "Gone")\n')
        found = check(root)
        assert len(found) == 4 and "docs/missing.md" in found[0] and "#no-such-heading" in found[1] \
            and "docs/nowhere.md" in found[2] and '"Gone": no such section' in found[3], found
    print("self-test passed: a missing file, a missing anchor, a source comment's path and section are caught")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) == 4 and argv[1] == "--policies":
        problems, checked = check_policies(argv[2], os.path.abspath(argv[3]))
        for p in problems:
            print(p)
        print(f"{checked} policies in the docs checked, {len(problems)} rejected")
        return 1 if problems or checked == 0 else 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    problems = check(os.path.abspath(argv[1]))
    for p in problems:
        print(p, flush=True)
    if problems:
        print(f"{len(problems)} broken link(s)", file=sys.stderr)
        return 1
    print("every link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
