#!/usr/bin/env python3
"""A sequence diagram from its text source (docs/diagrams/*.seq) as a Graphviz graph with fixed
positions, on stdout; scripts/docs.sh renders it with `neato -n2 -Tsvg`.

    title: the caption
    participants: W=Worker A | T=Lease table | B=Worker B
    W -> T: the message            an arrow from W's lifeline to T's
    T --> W: the answer            dashed: an answer
    W -x T: lost                   a request or answer that never arrives
    note W: what W does now        a note on W's lifeline
    == time passes ==              a separator across every lifeline

Rows read top to bottom, one after the other, as time goes.
"""
import re
import sys

COL = 250  # points between two lifelines
LINE = 13  # points per line of text


def esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def wrap(text: str, width: int) -> list:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    lines.append(line)
    return lines


def label(lines: list) -> str:
    return "\\n".join(esc(l) for l in lines)


def parse(path: str):
    title, parts, rows = "", [], []
    for n, raw in enumerate(open(path, encoding="utf-8"), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("title:"):
            title = line[6:].strip()
        elif line.startswith("participants:"):
            for p in line[13:].split("|"):
                key, _, name = p.strip().partition("=")
                parts.append((key.strip(), name.strip()))
        elif line.startswith("note "):
            m = re.fullmatch(r"note (\w+): (.*)", line)
            if not m:
                sys.exit(f"{path}:{n}: a note is `note KEY: text`")
            rows.append(("note", m[1], None, m[2]))
        elif line.startswith("=="):
            rows.append(("sep", None, None, line.strip("= ")))
        else:
            m = re.fullmatch(r"(\w+) (->|-->|-x) (\w+): (.*)", line)
            if not m or m[1] == m[3]:
                sys.exit(f"{path}:{n}: not a row (`A -> B: text`, A and B two participants): {line}")
            rows.append((m[2], m[1], m[3], m[4]))
    keys = [k for k, _ in parts]
    for _, a, b, _ in rows:
        for k in (a, b):
            if k is not None and k not in keys:
                sys.exit(f"{path}: {k} is not a participant ({', '.join(keys)})")
    return title, parts, rows


def main(path: str) -> None:
    title, parts, rows = parse(path)
    keys = [k for k, _ in parts]
    x = {k: 110 + i * COL for i, k in enumerate(keys)}
    out = ['digraph seq {',
           '  graph [fontname="Helvetica", fontsize=14, labelloc=t, outputorder=edgesfirst, pad=0.2'
           + (f', label="{esc(title)}"' if title else "") + "];",
           '  node [fontname="Helvetica", fontsize=11];',
           '  edge [fontname="Helvetica", fontsize=10, arrowsize=0.7];']
    # Laid out from the top (y going down), flipped into Graphviz's coordinates at the end.
    items, y = [], 0
    for k, name in parts:
        items.append(("node", f"h_{k}", x[k], y,
                      f'shape=box, style="rounded,filled", fillcolor="#e8eef7", color="#4a6fa5", label="{esc(name)}"'))
    y += 40
    for i, (kind, a, b, text) in enumerate(rows):
        if kind == "note":
            lines = wrap(text, 34)
            h = LINE * len(lines) + 14
            y += h / 2
            items.append(("node", f"n{i}", x[a], y,
                          f'shape=note, style=filled, fillcolor="#fff8dc", color="#b8a040", label="{label(lines)}"'))
            y += h / 2 + 12
        elif kind == "sep":
            y += 14
            mid = (x[keys[0]] + x[keys[-1]]) / 2
            items.append(("node", f"s{i}", mid, y,
                          f'shape=box, style=filled, fillcolor="#f2f2f2", color="#f2f2f2", fontcolor="#444444", label="{label(wrap(text, 70))}"'))
            y += 26
        else:
            span = abs(x[a] - x[b]) // 6.2
            lines = wrap(text, max(24, int(span)))
            y += LINE * len(lines) + 4
            items.append(("node", f"l{i}", (x[a] + x[b]) / 2, y - (LINE * len(lines)) / 2 - 2,
                          f'shape=plaintext, height=0, margin=0, label="{label(lines)}"'
                          + {"-->": ', fontcolor="#2f6f3f"', "-x": ', fontcolor="#b03030"', "->": ""}[kind]))
            y += 6
            style = {"->": 'color="#222222"', "-->": 'style=dashed, color="#2f6f3f"',
                     "-x": 'color="#b03030", arrowhead=tee'}[kind]
            end = x[b] if kind != "-x" else (x[a] + x[b]) / 2 + (x[b] - x[a]) / 4
            items.append(("node", f"a{i}", x[a], y, "shape=point, width=0.03, color=\"#222222\""))
            items.append(("node", f"b{i}", end, y, "shape=point, width=0.01, style=invis"))
            items.append(("edge", f"a{i}", f"b{i}", style))
            y += 14
    y += 10
    for k in keys:
        items.append(("node", f"f_{k}", x[k], y, "shape=point, width=0.01, style=invis"))
        items.insert(0, ("edge", f"h_{k}", f"f_{k}", 'arrowhead=none, style=dashed, color="#aaaaaa"'))
    bottom = y
    for item in items:
        if item[0] == "node":
            _, name, px, py, attrs = item
            out.append(f'  {name} [pos="{px:.0f},{bottom - py + 20:.0f}", {attrs}];')
    for item in items:
        if item[0] == "edge":
            _, a, b, attrs = item
            out.append(f"  {a} -> {b} [{attrs}];")
    out.append("}")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
