#!/usr/bin/env python3
"""docs.links: every relative link in the project's Markdown (README.md,
CHANGELOG.md, docs/, bench/README.md) names a file that exists, and every
#anchor a heading of the page it points to (GitHub's slugs). Prints each
broken link; exit 1 when there is one."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#+) (.*)$")


def slug(text):
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, fenced = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            m = None if fenced else HEADING.match(line.rstrip("\n"))
            if m:
                found.add(slug(m.group(2)))
    return found


def pages():
    yield os.path.join(ROOT, "README.md")
    yield os.path.join(ROOT, "CHANGELOG.md")
    yield os.path.join(ROOT, "bench", "README.md")
    docs = os.path.join(ROOT, "docs")
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md"):
            yield os.path.join(docs, name)


def main():
    bad = checked = 0
    for page in pages():
        if not os.path.exists(page):
            continue
        fenced = False
        with open(page, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.startswith("```"):
                    fenced = not fenced
                if fenced:
                    continue
                for label, target in LINK.findall(line):
                    if re.match(r"^[a-z]+:", target):
                        continue
                    checked += 1
                    path, _, anchor = target.partition("#")
                    dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                    where = "%s:%d" % (os.path.relpath(page, ROOT), number)
                    if not os.path.exists(dest):
                        print("%s: [%s](%s): no such file" % (where, label, target))
                        bad += 1
                    elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                        print("%s: [%s](%s): no heading #%s there" % (where, label, target, anchor))
                        bad += 1
    if bad:
        print("FAIL docs.links: %d broken link(s) of %d" % (bad, checked))
        return 1
    print("PASS docs.links: %d relative links resolve" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
