"""A one-line progress bar on stderr (a line per step when stderr is not a terminal)."""

from __future__ import annotations

import sys
import time


def _clock(s: float) -> str:
    s = int(s)
    if s >= 3600:
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


class Progress:
    """``total`` weighted steps; ``step(label, weight)`` starts one, ``done()`` ends it. The
    ETA scales elapsed time by the weight still to do (weights are rough seconds)."""

    def __init__(self, total_weight: float, width: int = 28) -> None:
        self.total = max(total_weight, 1e-9)
        self.done_weight = 0.0
        self.width = width
        self.t0 = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.current = ""
        self.current_weight = 0.0

    def _render(self, note: str = "") -> None:
        frac = min(1.0, self.done_weight / self.total)
        filled = int(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.monotonic() - self.t0
        eta = elapsed * (1 - frac) / frac if frac > 0.02 else None
        line = f"[{bar}] {frac:4.0%}  {self.current}{note}  elapsed {_clock(elapsed)}" + (
            f"  eta {_clock(eta)}" if eta is not None else ""
        )
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + line[:160])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def step(self, label: str, weight: float) -> None:
        self.current, self.current_weight = label, weight
        self._render()

    def done(self, note: str = "") -> None:
        self.done_weight += self.current_weight
        self._render(f"  {note}" if note else "")
        if self.tty and note:
            sys.stderr.write("\n")

    def say(self, text: str) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[2K")
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
