"""Each test tier's time against its budget, read from pytest's JUnit XML.

    python scripts/test_budget.py fast=outputs/tests/fast.xml process=outputs/tests/process.xml

``make test`` and ``make test-all`` write one XML file a tier under ``outputs/tests/`` and call
this afterwards. For each tier it prints the tests (passed, failed, skipped), the wall time
pytest measured for the session, the test time summed over the tests (above the wall time
when xdist workers ran side by side), the budget and the share of it used; then the slowest
tests of all tiers. A budget is a figure in the log, never an assertion: the script exits 0
whatever the times (and 2 only when a file cannot be read). The budgets are the ones
docs/development.md states, for a 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

# seconds of pytest wall time a tier may take on the 2-core CI machine: with lint and the
# cluster's start, CI (.ci/run) fits in 25 minutes
BUDGETS = {"fast": 300.0, "in-process": 600.0, "process": 720.0}


@dataclass(frozen=True)
class Case:
    tier: str
    test: str
    seconds: float
    outcome: str  # passed, failed, error or skipped


@dataclass(frozen=True)
class Tier:
    name: str
    wall: float
    cases: list[Case]

    def count(self, outcome: str) -> int:
        return sum(case.outcome == outcome for case in self.cases)


def _outcome(testcase: ET.Element) -> str:
    for outcome in ("failure", "error", "skipped"):
        if testcase.find(outcome) is not None:
            return {"failure": "failed"}.get(outcome, outcome)
    return "passed"


def read_tier(name: str, path: Path) -> Tier:
    """A tier's wall time and cases from one JUnit XML file pytest wrote."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    cases = [
        Case(
            name,
            f"{case.get('classname', '')}::{case.get('name', '')}",
            float(case.get("time", 0.0)),
            _outcome(case),
        )
        for suite in suites
        for case in suite.iter("testcase")
    ]
    return Tier(name, sum(float(suite.get("time", 0.0)) for suite in suites), cases)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:02.0f} s"


def report(tiers: list[Tier], slowest: int) -> str:
    lines = [
        f"{'tier':<11} {'passed':>6} {'failed':>6} {'skipped':>7} {'wall':>12} "
        f"{'summed':>12} {'budget':>12} {'used':>5}"
    ]
    for tier in tiers:
        budget = BUDGETS.get(tier.name)
        summed = sum(case.seconds for case in tier.cases)
        failed = tier.count("failed") + tier.count("error")
        lines.append(
            f"{tier.name:<11} {tier.count('passed'):>6} {failed:>6} {tier.count('skipped'):>7} "
            f"{_minutes(tier.wall):>12} {_minutes(summed):>12} "
            + (f"{_minutes(budget):>12} {tier.wall / budget:>5.0%}" if budget else f"{'-':>12}")
        )
    if len(tiers) > 1:
        wall = sum(tier.wall for tier in tiers)
        lines.append(f"{'all':<11} {'':>6} {'':>6} {'':>7} {_minutes(wall):>12}")
    cases = sorted((c for t in tiers for c in t.cases), key=lambda c: c.seconds, reverse=True)
    lines += ["", f"the {slowest} slowest tests:"]
    lines += [f"{c.seconds:8.1f} s  {c.tier:<11} {c.test}" for c in cases[:slowest]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tiers", nargs="+", metavar="TIER=XML", help="a tier and its XML file")
    parser.add_argument("--slowest", type=int, default=25, help="how many slow tests to list")
    args = parser.parse_args(argv)
    tiers = []
    for spec in args.tiers:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            parser.error(f"{spec!r} is not TIER=XML (e.g. fast=outputs/tests/fast.xml)")
        try:
            tiers.append(read_tier(name, Path(path)))
        except (OSError, ET.ParseError) as error:
            print(f"test_budget: cannot read tier {name!r} from {path}: {error}", file=sys.stderr)
            return 2
    print(report(tiers, args.slowest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
