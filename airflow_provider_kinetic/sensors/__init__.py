"""Sensors that wait on work submitted earlier: ``KineticJobSensor`` (a job handle from
XCom) and ``KineticBatchSensor`` (a batch submitted without waiting).  Same layer as
the operators (they share ``operators/common.py``); use triggers, hooks and core.
"""
