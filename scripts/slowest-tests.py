#!/usr/bin/env python3
"""Lists the slowest tests of a test log (libtest's `--report-time`
lines, "test NAME ... ok <1.234s>", the result maybe on a later line when
the test printed in between), slowest first: `slowest-tests.py LOG [N]`."""
import re
import sys

START = re.compile(r"^test (\S+) \.\.\. ?(.*)$")
DONE = re.compile(r"\b(ok|FAILED|ignored) <([0-9.]+)s>\s*$")


def main() -> None:
    log, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20
    times: list[tuple[float, str]] = []
    pending = None
    with open(log, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = START.match(line)
            if m:
                pending, rest = m.group(1), m.group(2)
                line = rest
            d = DONE.search(line)
            if d and pending:
                times.append((float(d.group(2)), pending))
                pending = None
    times.sort(reverse=True)
    for t, name in times[:n]:
        print(f"{t:8.1f} s  {name}")


if __name__ == "__main__":
    main()
