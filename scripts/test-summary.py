#!/usr/bin/env python3
"""test-summary.py - after ctest: every skipped test with its reason, then a count.

Reads the JUnit file `ctest --output-junit FILE` writes. A test skips by
exiting 77 after printing why (its last line of output, e.g. "skipped: torch
is not importable by python3"); that line is the reason shown here.
"""
import sys
import xml.etree.ElementTree as ET


def main(path, label):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"{label}: no test summary ({e})")
        return
    cases = root.iter("testcase")
    passed, skipped, failed = 0, [], []
    for c in cases:
        status = c.get("status")
        out = (c.findtext("system-out") or "").strip().splitlines()
        reason = next((l.strip() for l in reversed(out) if l.strip()), "no reason printed")
        if status == "notrun":
            skipped.append((c.get("name"), reason))
        elif status == "fail" or c.find("failure") is not None:
            failed.append(c.get("name"))
        else:
            passed += 1
    for name, reason in skipped:
        print(f"{label}: skipped {name}: {reason}")
    total = passed + len(skipped) + len(failed)
    print(f"{label}: {passed} passed, {len(skipped)} skipped, {len(failed)} failed of {total} tests"
          + (": " + ", ".join(failed) if failed else ""))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "ctest")
