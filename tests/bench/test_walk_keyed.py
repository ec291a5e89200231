"""benchmarks/walk_keyed.py: the rooms a keyed call's payload passes through."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from benchmarks.walk_keyed import Walk, figures

ROOT = Path(__file__).resolve().parents[2]


def test_stays_returns_and_hand_offs_are_counted_from_the_frames() -> None:
    walk = Walk(
        frames=[
            ("a.py", "f"),
            ("a.py", "g"),
            ("b.py", "h"),
            ("a.py", "f"),  # back in a.py: a return
            ("c.py", "k"),
            ("b.py", "h"),  # another
        ],
        hand_offs=["c.py:k"],
    )
    stays = walk.stays()
    assert [(s.room, s.functions, s.again) for s in stays] == [
        ("a.py", ["f", "g"], False),
        ("b.py", ["h"], False),
        ("a.py", ["f"], True),
        ("c.py", ["k"], False),
        ("b.py", ["h"], True),
    ]
    assert figures(walk) == {"frames": 6, "rooms": 3, "stays": 5, "returns": 2, "hand-offs": 1}


def test_a_memory_store_call_is_followed_from_its_frames_to_the_reply() -> None:
    # In a process of its own: the walk turns every C accelerator off before gosim is
    # imported.
    script = textwrap.dedent(
        """
        import json
        from benchmarks.walk_keyed import follow, figures
        walk = follow("memory", False)
        print(json.dumps({"figures": figures(walk), "frames": walk.frames}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    functions = [f for _, f in seen["frames"]]
    rooms = {room for room, _ in seen["frames"]}
    # From the frames the reader cut, through the dispatcher and the keyed call, to the
    # reply's bytes written to the socket.
    assert "Dispatcher.handle_payload" in functions
    assert functions.index("Dispatcher.handle_payload") < functions.index("KeyedCall.start")
    assert functions.index("KeyedCall.start") < functions.index("RPCCall.finish")
    assert "idempotency/stores/memory.py" in rooms
    # It ends at the reply's bytes handed to the socket: the frame writer's send, from
    # the handler's goroutine (no writer goroutine in between).
    assert seen["frames"][-1] == ["netframe/_conn.py", "PyFrameWriter.__call__"]
    assert "FramedConn._writer" not in functions
    assert not any(room.startswith("gosim/_core/") for room in rooms)
    fig = seen["figures"]
    assert fig["stays"] >= fig["rooms"] and fig["returns"] == fig["stays"] - fig["rooms"]
