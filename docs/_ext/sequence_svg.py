"""Draw the design page's sequence diagram as SVG: ``python docs/_ext/sequence_svg.py``.

The site reads offline, so its diagrams are files, not a script fetched by the browser;
this writes ``docs/img/rpc-call.svg`` from the table below, and tests/test_site.py checks
the committed file is what it writes (edit the table, run this, commit both).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).resolve().parents[1] / "img" / "rpc-call.svg"

PARTICIPANTS = [
    ("C", "caller goroutine"),
    ("RC", "rpc.Client"),
    ("S", "server reader (netframe)"),
    ("D", "Dispatcher"),
    ("I", "Idempotency"),
    ("G", "GroupCommitter"),
    ("DB", "SQLite (OS thread)"),
]

# (from, to, label, reply): a reply is drawn dashed.
MESSAGES = [
    ("C", "RC", 'call("transfer", ..., key)', False),
    (
        "RC",
        "S",
        "request [0, msgid, method, params, meta] in a DATA frame"
        " (meta: key, caller, time left, attempt)",
        False,
    ),
    ("S", "D", "the payload, on the connection's reader", False),
    ("D", "I", "run(caller, key, request, handler)", False),
    ("I", "G", "claim (joins the batch in flight, or leads the next one)", False),
    ("G", "DB", "one transaction for the whole batch, one fsync", False),
    ("DB", "G", "committed", True),
    ("G", "I", "CLAIMED with a fence (or REPLAY: the recorded bytes)", True),
    ("I", "I", "handler(call) returns an SQLiteEffect", False),
    ("I", "G", "complete(fence, effect)", False),
    ("G", "DB", "effect and record in one transaction, one fsync", False),
    ("DB", "G", "committed", True),
    ("G", "I", "the completed record", True),
    ("I", "D", "Outcome (value bytes, replayed flag)", True),
    ("D", "S", "the response bytes", True),
    ("S", "RC", "[1, msgid, error, result] in a DATA frame", True),
    ("RC", "C", "the result (the waiter for msgid settled)", True),
]

COL = 150  # between lifelines
MARGIN = 20
BOX_W, BOX_H = 136, 40
LINE = 15  # one line of label text
CHAR = 6.0  # the width of a character of the 12 px sans-serif labels, about
FONT = "font-family:Helvetica,Arial,sans-serif;font-size:12px"


def _x(name: str) -> float:
    index = [p for p, _ in PARTICIPANTS].index(name)
    return MARGIN + BOX_W / 2 + index * COL


def _box(x: float, y: float, title: str) -> list[str]:
    lines = textwrap.wrap(title, int(BOX_W / CHAR))
    top = y + BOX_H / 2 - (len(lines) - 1) * LINE / 2 + 4
    out = [
        f'<rect x="{x - BOX_W / 2:.1f}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="4"'
        ' fill="#eef2fb" stroke="#3f51b5"/>'
    ]
    out += [
        f'<text x="{x:.1f}" y="{top + i * LINE:.1f}" text-anchor="middle">{escape(t)}</text>'
        for i, t in enumerate(lines)
    ]
    return out


def render() -> str:
    body: list[str] = []
    y = MARGIN + BOX_H + 24
    for src, dst, label, reply in MESSAGES:
        x1, x2 = _x(src), _x(dst)
        span = abs(x2 - x1) if src != dst else COL
        lines = textwrap.wrap(label, max(12, int((span - 12) / CHAR)))
        mid = (x1 + x2) / 2 if src != dst else x1 + 8
        anchor = "middle" if src != dst else "start"
        for i, t in enumerate(lines):
            body.append(
                f'<text x="{mid:.1f}" y="{y + i * LINE:.1f}" text-anchor="{anchor}">'
                f"{escape(t)}</text>"
            )
        y += (len(lines) - 1) * LINE + 8
        dash = ' stroke-dasharray="5,4"' if reply else ""
        if src == dst:
            body.append(
                f'<path d="M{x1:.1f},{y} h36 v16 h-32" fill="none" stroke="#333"{dash}'
                ' marker-end="url(#arrow)"/>'
            )
            y += 16
        else:
            body.append(
                f'<line x1="{x1:.1f}" y1="{y}" x2="{x2:.1f}" y2="{y}" stroke="#333"{dash}'
                ' marker-end="url(#arrow)"/>'
            )
        y += 26
    height = y + BOX_H
    width = 2 * MARGIN + BOX_W + (len(PARTICIPANTS) - 1) * COL
    head: list[str] = []
    for name, title in PARTICIPANTS:
        x = _x(name)
        head.append(
            f'<line x1="{x:.1f}" y1="{MARGIN + BOX_H}" x2="{x:.1f}" y2="{y}"'
            ' stroke="#999" stroke-dasharray="2,3"/>'
        )
        head += _box(x, MARGIN, title)
        head += _box(x, y, title)
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}"'
            f' height="{height + MARGIN:.0f}" viewBox="0 0 {width:.0f} {height + MARGIN:.0f}"'
            f' style="{FONT}" role="img">',
            "<title>One idempotent call, from client to commit and back</title>",
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5"'
            ' markerWidth="8" markerHeight="8" orient="auto-start-reverse">'
            '<path d="M0,0 L10,5 L0,10 z" fill="#333"/></marker></defs>',
            '<rect width="100%" height="100%" fill="#fff"/>',
            *head,
            *body,
            "</svg>",
            "",
        ]
    )


if __name__ == "__main__":
    OUT.write_text(render(), encoding="utf-8")
    sys.stdout.write(f"wrote {OUT}\n")
