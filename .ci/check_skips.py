"""Fail CI if pytest skipped anything other than GPU-only tests."""

import sys
import xml.etree.ElementTree as ET

ALLOWED = ("needs CUDA",)


def main(path: str) -> int:
    """Read a junit XML report and list skips whose reason is not an allowed one."""
    bad, allowed = [], 0
    for case in ET.parse(path).getroot().iter("testcase"):
        for skip in case.findall("skipped"):
            reason = (skip.get("message") or skip.text or "").strip()
            # pytest writes "reason" for skipif markers and "file:line: reason" for pytest.skip()
            if any(a in reason for a in ALLOWED):
                allowed += 1
            else:
                bad.append(f"{case.get('classname')}::{case.get('name')}: {reason}")
    cases = sum(1 for _ in ET.parse(path).getroot().iter("testcase"))
    if cases == 0:
        print(f"skip gate: {path} holds no test at all")
        return 1
    print(f"skip gate ({path}): {cases} tests, {allowed} GPU-only skip(s) allowed, "
          f"{len(bad)} unexpected")
    for line in bad:
        print("  unexpected skip:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: check_skips.py JUNIT.xml [JUNIT.xml ...]")
    sys.exit(max(main(path) for path in sys.argv[1:]))
