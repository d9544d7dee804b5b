"""An access log of a `tfra-de serve` process: one line per answered request, to stderr or a
file, at most `max_rate` lines per second (a token bucket: bursts of up to one second's worth
pass; lines above the rate are dropped and counted, and the count is written with the next
line that passes, so a busy server does not spend its time logging).

    2026-12-02T09:50:42.123Z rest POST /v1/models/m:predict 200 12.3ms rows=16 peer=127.0.0.1

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> log = AccessLog(out, max_rate=1)
    >>> log.write("rest", "POST /v1/models/m:predict", 200, 0.0123, rows=16, peer="127.0.0.1")
    >>> log.write("rest", "POST /v1/models/m:predict", 200, 0.0123)   # above 1 line/s: dropped
    >>> out.getvalue().split(" ", 1)[1]
    'rest POST /v1/models/m:predict 200 12.3ms rows=16 peer=127.0.0.1\\n'
    >>> log.dropped
    1
"""

import sys
import threading
import time


class AccessLog:
    """Writes request lines to `stream` (a text file object), at most `max_rate` per second
    (0 or None: no limit). Thread-safe: the REST loop and the gRPC threads share one."""

    def __init__(self, stream=None, max_rate=100.0):
        if max_rate is not None and max_rate < 0:
            raise ValueError(f"max_rate must be >= 0 lines per second; got {max_rate!r}")
        self.stream = stream or sys.stderr
        self.max_rate = float(max_rate or 0)
        self.dropped = 0            # lines dropped since the last written one
        self._tokens = self.max_rate
        self._last = time.monotonic()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path, max_rate=100.0):
        """An AccessLog on `path` ("-": stderr; appended, line buffered); None for "off"."""
        if path in (None, "", "off", "none"):
            return None
        if path == "-":
            return cls(sys.stderr, max_rate)
        return cls(open(path, "a", buffering=1, encoding="utf-8"),  # pylint: disable=consider-using-with
                   max_rate)

    def write(self, api, target, code, seconds, rows=0, peer=""):
        """Logs one request: `api` "rest" / "grpc", `target` e.g. "POST /v1/models/m:predict"."""
        with self._lock:
            if self.max_rate:
                now = time.monotonic()
                self._tokens = min(self.max_rate,
                                   self._tokens + (now - self._last) * self.max_rate)
                self._last = now
                if self._tokens < 1:
                    self.dropped += 1
                    return
                self._tokens -= 1
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
            line = (f"{stamp}.{int(time.time() * 1000) % 1000:03d}Z {api} {target} {code} "
                    f"{seconds * 1e3:.1f}ms")
            if rows:
                line += f" rows={rows}"
            if peer:
                line += f" peer={peer}"
            if self.dropped:
                line += f" (dropped {self.dropped} lines above {self.max_rate:g}/s)"
                self.dropped = 0
            self.stream.write(line + "\n")

    def close(self):
        if self.stream not in (sys.stderr, sys.stdout):
            self.stream.close()
