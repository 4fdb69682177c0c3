"""scripts/check_test_timing.py: no sleeps as synchronisation, no asserts on elapsed
wall-clock time in the tests, except where marked ``# timing-ok: <reason>``."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "check_test_timing", REPO / "scripts/check_test_timing.py"
)
checker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checker)


def check(source: str) -> tuple[list[str], int]:
    return checker.check_source(textwrap.dedent(source), "t.py")


def test_a_sleep_is_flagged_in_every_spelling():
    problems, escapes = check(
        """
        import asyncio
        import time
        import time as clock
        from time import sleep

        def f():
            time.sleep(0.05)
            clock.sleep(1)
            sleep(2)

        async def g():
            await asyncio.sleep(0.01)
        """
    )
    assert [p.split(": ")[0] for p in problems] == ["t.py:8", "t.py:9", "t.py:10", "t.py:13"]
    assert all("sleep" in p for p in problems) and escapes == 0


def test_a_marked_sleep_is_an_escape_on_its_line_or_the_line_above():
    problems, escapes = check(
        """
        import time

        def workload(release):  # shipped to a job: the job's own loop
            time.sleep(0.05)  # timing-ok: the job's workload polls its release file
            # timing-ok: the double's own poll interval
            time.sleep(0.02)
        """
    )
    assert problems == [] and escapes == 2


def test_a_marker_without_a_reason_is_flagged():
    problems, escapes = check(
        """
        import time
        time.sleep(1)  # timing-ok:
        """
    )
    assert problems == [
        "t.py:3: marker: '# timing-ok:' needs a reason",
        "t.py:3: sleep: wait on a state with wait_for",
    ]
    assert escapes == 0


def test_a_yield_to_the_loop_and_sleeps_in_strings_are_allowed():
    problems, _ = check(
        """
        import asyncio

        async def f():
            await asyncio.sleep(0)

        SCRIPT = "import time; time.sleep(1)"
        """
    )
    assert problems == []


def test_an_elapsed_time_assert_is_flagged():
    problems, _ = check(
        """
        import time
        from datetime import datetime

        def f():
            start = time.monotonic()
            assert time.monotonic() - start < 10
            took = time.perf_counter() - start
            assert took < 1
            now = time.time()
            assert now - start < 1
            assert elapsed_s < 5
            assert (datetime.now() - made).seconds < 2
        """
    )
    assert [p.split(": ")[0] for p in problems] == [
        "t.py:7",
        "t.py:9",
        "t.py:11",
        "t.py:12",
        "t.py:13",
    ]
    assert all("elapsed" in p for p in problems)


def test_a_deadline_check_is_not_elapsed_time():
    problems, _ = check(
        """
        import time

        def f(deadline):
            assert time.monotonic() < deadline, "timed out"
            obj.since = time.monotonic() - 600
            assert obj.failed() <= 0.5
        """
    )
    assert problems == []


def test_the_tests_pass_the_check():
    problems, _ = checker.check_tree(REPO)
    assert problems == [], "\n".join(problems)
