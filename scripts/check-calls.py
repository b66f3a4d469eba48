#!/usr/bin/env python3
"""layout.calls: fails when the calls between shim/'s files go round in a circle.

A file calls another when it names a function (dgc_*, not static) that the
other defines. The files must form layers of callers and callees: a circle
(a.c -> b.c -> ... -> a.c) is printed with the function behind each link,
and the script exits 1. Calls through pointers (callbacks) are not seen.
Usage: scripts/check-calls.py [repository root]"""
import collections, pathlib, re, sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
files = sorted((root / "shim").rglob("*.c"))
strip = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\])*\"", re.S)
define = re.compile(r"^(?!static\b)[A-Za-z_][\w \*]*?\b(dgc_\w+)\s*\([^;{]*\)\s*\{", re.M)
texts = {f: strip.sub(" ", f.read_text()) for f in files}
owner = {}
for f, t in texts.items():
    for m in define.finditer(t):
        owner[m.group(1)] = f
call = re.compile(r"\b(dgc_\w+)\s*\(")
edges = collections.defaultdict(dict)
for f, t in texts.items():
    for m in call.finditer(t):
        g = owner.get(m.group(1))
        if g and g != f:
            edges[f].setdefault(g, m.group(1))
# Tarjan's strongly connected components
index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: comps.append(comp)
sys.setrecursionlimit(10000)
for f in files:
    if f not in index: visit(f)
rel = lambda p: str(p.relative_to(root))
for comp in comps:
    members = set(comp)
    print("FAIL layout.calls: these files call each other in a circle:")
    for f in sorted(comp, key=rel):
        for g, fn in sorted(edges[f].items(), key=lambda e: rel(e[0])):
            if g in members: print(f"  {rel(f)} -> {rel(g)} ({fn})")
if comps: sys.exit(1)
print(f"PASS layout.calls: {sum(len(e) for e in edges.values())} links between {len(files)} files, no circle")
