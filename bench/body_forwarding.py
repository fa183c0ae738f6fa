"""The proxy's per-request body work, old against new, side by side in one process: re-serialising the compressed
request (``json.loads`` + ``json.dumps``) against one `parse_body` pass plus the byte cut, on synthetic histories.

    python -m bench.body_forwarding                # medians of 30 runs, 32 and 1,000 blocks
"""

from __future__ import annotations

import json
import statistics
import timeit

from gemkernels.serve.body import parse_body, without_elements
from gemkernels.testing.histories import synthetic_history


def median_seconds(fn, repeat: int = 30) -> float:
    return statistics.median(timeit.repeat(fn, number=1, repeat=repeat))


def main() -> None:
    for blocks in (32, 1000):
        for ensure_ascii in (True, False):
            body = {"model": "m", "messages": synthetic_history(blocks, seed=1)}
            body["messages"][0]["content"] += " — réponse ✓" * 50
            raw = json.dumps(body, ensure_ascii=ensure_ascii).encode()
            parsed, layout = parse_body(raw, "messages")
            removed = list(range(2, len(layout.elements) // 2))
            kept = [m for i, m in enumerate(parsed["messages"]) if i not in set(removed)]

            def reserialise() -> bytes:
                loaded = json.loads(raw)
                return json.dumps({**loaded, "messages": kept}, ensure_ascii=False).encode()

            def cut() -> bytes:
                _, lay = parse_body(raw, "messages")
                return without_elements(raw, lay, removed)

            old, new, floor = median_seconds(reserialise), median_seconds(cut), median_seconds(lambda: json.loads(raw))
            print(f"{blocks:5d} blocks, {len(raw) / 1e6:.2f} MB, ensure_ascii={ensure_ascii!s:5}: json.loads "
                  f"{floor * 1e3:6.2f} ms | loads+dumps {old * 1e3:6.2f} ms | parse_body+cut {new * 1e3:6.2f} ms "
                  f"= {new / old:.2f}x re-serialising, {new / floor:.2f}x one json.loads")


if __name__ == "__main__":
    main()
