"""A job's line into the task log at the job's time: structlog (Airflow 3's loggers)
keeps the stamp the event brings; a stdlib record gets it as ``created``."""

from __future__ import annotations

import logging

import structlog

from airflow_provider_kinetic.core.backends.base import TimedText
from airflow_provider_kinetic.core.logat import info_at, iso, timed_lines

NS = 1_800_000_000_123_456_789


def test_structlog_events_carry_the_jobs_time_as_airflows_iso_stamp():
    with structlog.testing.capture_logs() as events:
        info_at(structlog.get_logger("kinetic.test"), NS, "[child %d] %s", 3, "hello")
        info_at(structlog.get_logger("kinetic.test"), None, "no time")
    assert events[0]["timestamp"] == iso(NS) == "2027-01-15T08:00:00.123456Z"
    # Airflow's stamper keeps a timestamp the event has (it would add its own otherwise)
    stamper = structlog.processors.MaybeTimeStamper(fmt="iso")
    assert stamper(None, "info", dict(events[0]))["timestamp"] == iso(NS)
    assert "timestamp" not in events[1]


def test_a_stdlib_record_is_created_at_the_jobs_time(caplog):
    caplog.set_level(logging.INFO, logger="kinetic.test.logat")
    info_at(logging.getLogger("kinetic.test.logat"), NS, "[%s] %s", "job-1", "hello")
    (record,) = caplog.records
    assert record.getMessage() == "[job-1] hello" and round(record.created) == NS // 10**9


def test_timed_lines_keep_each_lines_time_through_splitlines():
    text = TimedText("a\rb\n\nc\n", [1, 2, 3])
    assert timed_lines(text) == [("a", 1), ("b", 1), ("", 2), ("c", 3)]
    assert timed_lines("x\ny\n") == [("x", None), ("y", None)]
