#!/usr/bin/env python3
"""Checks that the subfolders of a source folder are layers: a file may include headers of its
own folder and of the folders listed before it, never of one listed after it.

    check_layers.py ROOT PREFIX LAYER [LAYER ...]

ROOT is the folder (e.g. src/serve), PREFIX the include prefix of its headers (e.g. serve),
the LAYERs its subfolders, lowest first. Prints every arrow between folders with its count
and exits 1 naming each include that points up, and each subfolder missing from the list.
"""
import collections
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def main(argv):
    if len(argv) < 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    root, prefix, layers = argv[1], argv[2].rstrip("/") + "/", argv[3:]
    rank = {name: i for i, name in enumerate(layers)}
    problems = []
    present = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    for d in present:
        if d not in rank:
            problems.append(f"{root}/{d}/: not in the layer list {' < '.join(layers)}")
    arrows = collections.Counter()
    for dirpath, _, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == ".":
            continue
        src_layer = rel.split(os.sep)[0]
        for f in sorted(files):
            if not f.endswith((".h", ".cpp")):
                continue
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, 1):
                    m = INCLUDE.match(line)
                    if not m or not m.group(1).startswith(prefix):
                        continue
                    dst_layer = m.group(1)[len(prefix):].split("/")[0]
                    if dst_layer == src_layer:
                        continue
                    arrows[(src_layer, dst_layer)] += 1
                    if src_layer in rank and dst_layer in rank and rank[dst_layer] > rank[src_layer]:
                        problems.append(f"{path}:{lineno}: {src_layer}/ includes {m.group(1)}, a layer above it")
    print(f"{root}: layers {' < '.join(layers)}; {len(arrows)} arrows between folders:")
    for (a, b), n in sorted(arrows.items()):
        up = rank.get(b, -1) > rank.get(a, len(layers))
        print(f"  {a} -> {b}: {n} include(s){'  UP' if up else ''}")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
