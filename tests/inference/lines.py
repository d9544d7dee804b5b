"""Reading a child process's output with a deadline (a silent, hung child must fail the test in
bounded time, not block a `for line in proc.stdout` loop forever)."""

import os
import select
import time


def wait_for_line(proc, prefix, timeout=60.0):
    """Reads `proc.stdout` (a pipe) until a line starting with `prefix` and returns it;
    AssertionError with what it printed when the process exits first or `timeout` seconds pass.
    Reads the pipe's descriptor directly: a buffered reader could hold the line while `select`
    waits for more."""
    deadline, output = time.monotonic() + timeout, b""
    fd = proc.stdout.fileno()
    while True:
        for line in output.decode(errors="replace").splitlines(keepends=True):
            if line.startswith(prefix) and line.endswith("\n"):
                return line
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {prefix!r} line in {timeout:.0f} s: {output[-3000:]!r}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"exited with {proc.wait()} before printing {prefix!r}: "
                                     f"{output[-3000:]!r}")
            output += chunk
