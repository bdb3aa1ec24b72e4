"""The test suite's own layout: pytest imports each test module by its basename
(the test directories are not packages), so two test modules with one basename
in different directories collide, and a run collects an error instead of both.
A targeted run of one directory never shows it; this test does."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_basename():
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"test modules sharing a basename (rename one of each): {clashes}"
