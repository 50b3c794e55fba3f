"""pytest plugin for harness/deepspeed_suite.py: one JSON line per test to $ZT_SUITE_RESULTS.

It only records what happened (outcome, skip reason, the exception chain, and the name of a
DeepSpeed placeholder if one raised); deepspeed_suite.py classifies.
"""

from __future__ import annotations

import json
import os

import pytest

_PATH = os.environ.get("ZT_SUITE_RESULTS")
_seen: dict[str, dict] = {}


def _write(record: dict) -> None:
    if _PATH:
        with open(_PATH, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _chain(exc: BaseException | None) -> list[dict]:
    out, seen = [], set()
    while exc is not None and id(exc) not in seen and len(out) < 8:
        seen.add(id(exc))
        text = " ".join(str(exc).split())
        entry = {"type": type(exc).__name__, "message": text if len(text) < 900 else f"{text[:300]} ... {text[-600:]}"}
        name = getattr(exc, "name", None) if type(exc).__name__ == "NotInZerotrain" else None
        if name:
            entry["absent"] = name
        out.append(entry)
        exc = exc.__cause__ or exc.__context__
    return out


def pytest_collection_finish(session):
    for item in session.items:  # after -k / --deselect
        _write({"event": "collected", "nodeid": item.nodeid})


def pytest_collectreport(report):
    if report.skipped and isinstance(report.longrepr, tuple):  # pytest.skip(allow_module_level=True)
        _write({"event": "collect_skip", "nodeid": report.nodeid, "reason": report.longrepr[2]})
    if report.failed:
        _write({"event": "collect_error", "nodeid": report.nodeid,
                "message": " ".join(str(report.longrepr).split())[-600:]})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    record = _seen.setdefault(item.nodeid, {"event": "result", "nodeid": item.nodeid, "outcome": "passed"})
    record["seconds"] = round(record.get("seconds", 0.0) + report.duration, 2)
    if report.skipped and record["outcome"] == "passed":
        record["outcome"] = "skipped"
        longrepr = report.longrepr
        record["reason"] = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    elif report.failed:
        record["outcome"] = "failed"
        record.setdefault("phase", report.when)
        record.setdefault("chain", _chain(call.excinfo.value if call.excinfo else None))
    if report.when == "teardown":
        _write(_seen.pop(item.nodeid))
