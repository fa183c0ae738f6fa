"""The proxy's work per request for each API and history shape, at the sizes of the recorded sessions: Claude Code
(Messages), Codex (Responses), OpenHands (chat with tool calls) and mini-swe-agent (chat with text actions).

    python -m bench.formats_overhead [--repeats 30]

For each family, the longest recorded session's last request (from ../shared, through `gemkernels.evaluate.
loaders`) is laid out as a client would send it; timed side by side in one process, medians of CPU time: one
``json.loads`` of the body (the floor: any reader of the body pays it), and the proxy's work on a warm session
(`parse_body`, `GEM.compress` with the hash encoder on the append path, given the body's bytes as the proxy gives
them, and the byte cut). The session saw 90% of the history, then this request: the timed calls repeat it, so
their parse resumes with nothing added.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gemkernels import GEM
from gemkernels.benchmark.timing import compare, fmt_seconds
from gemkernels.compress.encoders import CachedEncoder, HashEncoder
from gemkernels.evaluate.loaders import load_runs
from gemkernels.serve.body import element_sizes, forwarded_body, parse_body

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
#: family -> (recorded sessions, the body field holding the history)
FAMILIES = {"Claude Code (messages)": ("logs/claude-code", "messages"), "Codex (responses)": ("logs/codex", "input"),
            "OpenHands (chat, tool calls)": ("logs/openhands", "messages"),
            "mini-swe-agent (chat, text actions)": ("trajectories/mini-swe-agent", "messages")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"the recorded sessions ({SHARED}) are absent")
    print("| history | messages | body | json.loads | proxy work | ratio |\n|---|---|---|---|---|---|")
    for family, (folder, field) in FAMILIES.items():
        runs, _ = load_runs(SHARED / folder)
        run = max(runs, key=lambda r: len(json.dumps(r.messages)))
        history = run.messages
        raw = json.dumps({"model": "m", field: history, "stream": True}, ensure_ascii=False).encode()
        gem = GEM("cache-aware", encoder=CachedEncoder(HashEncoder(384)), token_counter=None)
        gem.compress(history[: len(history) * 9 // 10], session_id="bench")  # the session is warm

        def proxy_work() -> bytes | None:
            body, layout = parse_body(raw, field)
            result = gem.compress(body[field], session_id="bench", message_sizes=element_sizes(layout),
                                  message_bytes=(raw, layout.elements))  # as the proxy passes them
            return forwarded_body(raw, layout, body[field], result.messages)

        timings = compare({"loads": lambda: json.loads(raw), "proxy": proxy_work}, repeats=args.repeats)
        floor, work = timings["loads"].median, timings["proxy"].median
        print(f"| {family} | {len(history)} | {len(raw) / 1e6:.2f} MB | {fmt_seconds(floor)} | {fmt_seconds(work)} "
              f"| {work / floor:.2f}x |")


if __name__ == "__main__":
    main()
