#!/usr/bin/env python3
"""check_layers.py - the rooms of epx and the order they stand in, checked.

Each room is a folder of src/ (or a program folder on top). A room may use
only the rooms it lists in ROOMS below: those stand on lower floors, so every
import points down and no circle can form. Two kinds of import are read from
the sources, without building anything:

  * #include "..." lines (a private header of another room: "../plan/x.h");
  * uses of a function another room defines. Every file includes epx.h, so a
    call through the public API is an import too: the script finds where each
    epx_*/epxi_* function is defined and who names it.

It also checks that no files call each other in a circle, and prints the
floors (the longest chain of rooms from the ground).

Add a room: a line in ROOMS with the rooms it may use (lower floors only), a
folder, and a line in docs/ARCHITECTURE.md. Usage: check_layers.py [ROOT]
"""
import os
import re
import sys

# room: (folder, rooms it may use). Order: ground floor first. Public headers
# (include/) are the surface every room may read; they declare, never define.
ROOMS = {
    "core": ("src/core", []),
    "layout": ("src/layout", ["core"]),
    "plan": ("src/plan", ["core", "layout"]),
    "dispatch": ("src/dispatch", ["core", "layout"]),
    "stats": ("src/stats", ["core", "layout"]),
    "io": ("src/io", ["core", "layout"]),
    "report": ("src/report", ["core", "layout"]),
    "comm": ("src/comm", ["core", "layout"]),
    # Kernels stand beside the CPU references they are tested against.
    "cuda": ("src/cuda", ["core", "layout", "dispatch"]),
    "engine": ("src/engine", ["core", "layout", "plan", "dispatch", "stats", "io", "report",
                              "comm"]),
    "cli": ("tools/epx", ["core", "layout", "plan", "dispatch", "stats", "io", "report", "comm",
                          "cuda", "engine"]),
}

# Known imports that point up, each with who removes it. Keep this short.
EXCEPTIONS = {
    # None: add a (room, room, symbol) triple here, with the reason, only for
    # a call that must run up for now, and remove it when it is fixed.
}

SOURCE_EXT = (".c", ".h", ".cu", ".cuh")


def room_of(rel):
    for room, (folder, _) in ROOMS.items():
        if rel == folder or rel.startswith(folder + "/"):
            return room
    return None


def strip(text):
    """Source without comments, strings, char literals and preprocessor
    lines (newlines kept, so brace depth is all that matters)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    text = re.sub(r"'(\\.|[^'\\\n])*'", "''", text)
    text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", "", text, flags=re.M)
    return text


IDENT = re.compile(r"\b(epxi?_[A-Za-z0-9_]+)\s*\(")


def definitions(text):
    """Names of epx_/epxi_ functions defined at file level (extern "C"
    blocks do not count as a level)."""
    out = set()
    depth = 0
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "{":
            before = text[max(0, i - 40):i]
            if not re.search(r"\bextern\s*\"\"\s*$", before):
                depth += 1
        elif c == "}":
            depth = max(0, depth - 1)
        elif depth == 0:
            m = IDENT.match(text, i)
            if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                j = m.end()
                level = 1
                while j < n and level:
                    level += {"(": 1, ")": -1}.get(text[j], 0)
                    j += 1
                rest = text[j:j + 200].lstrip()
                if rest.startswith("{"):
                    out.add(m.group(1))
                i = m.end() - 1
        i += 1
    return out


def bodies(text):
    """The text inside braces (function bodies, initialisers), where a name
    is a use; at file level it is a declaration or a definition."""
    out = []
    depth = 0
    for i, c in enumerate(text):
        if c == "{":
            if not re.search(r"\bextern\s*\"\"\s*$", text[max(0, i - 40):i]):
                depth += 1
                continue
        elif c == "}":
            depth = max(0, depth - 1)
        out.append(c if depth > 0 else " " if c != "\n" else c)
    return "".join(out)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    files = {}
    for room, (folder, _) in ROOMS.items():
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in names:
                if name.endswith(SOURCE_EXT):
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, root)
                    with open(path, encoding="utf-8", errors="replace") as f:
                        raw = f.read()
                    files[rel] = (raw, strip(raw))
    problems = []
    for name in sorted(os.listdir(os.path.join(root, "src"))):
        if os.path.isdir(os.path.join(root, "src", name)) and room_of("src/" + name) is None:
            problems.append("src/%s is in no room: add it to ROOMS" % name)
    defined = {}
    for rel, (_, text) in files.items():
        for name in definitions(text):
            defined.setdefault(name, rel)

    room_edges = set()
    file_edges = {rel: set() for rel in files}
    for rel, (raw, text) in files.items():
        room = room_of(rel)
        allowed = set(ROOMS[room][1]) | {room}
        # Includes of private headers.
        for m in re.finditer(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', raw, flags=re.M):
            inc = m.group(1)
            cands = [os.path.normpath(os.path.join(os.path.dirname(rel), inc)),
                     os.path.normpath(os.path.join("src/core", inc)),
                     os.path.normpath(os.path.join("include", inc))]
            target = next((c for c in cands if os.path.exists(os.path.join(root, c))), None)
            if target is None or target.startswith("include/") or target.startswith("tests/"):
                continue
            troom = room_of(target)
            if troom is None:
                problems.append("%s includes %s, which is in no room" % (rel, inc))
                continue
            if troom != room:
                room_edges.add((room, troom))
                if target in files:
                    file_edges[rel].add(target)
            if troom not in allowed:
                problems.append("%s includes %s: %s may not import %s" % (rel, inc, room, troom))
        # Uses of functions other files define.
        for name in set(re.findall(r"\b(epxi?_[A-Za-z0-9_]+)\b", bodies(text))):
            target = defined.get(name)
            if target is None or target == rel:
                continue
            troom = room_of(target)
            file_edges[rel].add(target)
            if troom == room:
                continue
            room_edges.add((room, troom))
            if troom not in allowed and (room, troom, name) not in EXCEPTIONS:
                problems.append("%s uses %s (%s): %s may not import %s" %
                                (rel, name, target, room, troom))

    # The declared order must itself point down: a room lists only rooms
    # declared before it.
    order = list(ROOMS)
    for room, (_, uses) in ROOMS.items():
        for u in uses:
            if u not in ROOMS or order.index(u) >= order.index(room):
                problems.append("ROOMS: %s lists %s, which is not below it" % (room, u))

    # No circle of files (Tarjan's strongly connected components).
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(file_edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(file_edges):
        if v not in index:
            visit(v)
    for comp in sccs:
        problems.append("files in a circle: " + " <-> ".join(comp))

    # Floors: the longest chain of declared rooms, the ground floor being 1.
    floor = {}
    for room in order:
        floor[room] = 1 + max([floor[u] for u in ROOMS[room][1]] or [0])
    floors = max(floor.values())
    for room in order:
        print("floor %d  %-9s %-13s uses %s" % (floor[room], room, ROOMS[room][0],
                                               ", ".join(ROOMS[room][1]) or "-"))
    used = sorted("%s -> %s" % e for e in room_edges)
    print("imports found: %s" % "; ".join(used))
    print("%d rooms on %d floors, %d files" % (len(ROOMS), floors, len(files)))
    if floors > 6:
        problems.append("%d floors: at most 6" % floors)
    for p in problems:
        print("LAYERS: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
