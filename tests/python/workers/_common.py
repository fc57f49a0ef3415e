"""Helpers for worker scripts run by the Python tests."""

import json
import sys


def report(obj):
    """One line the test reads back with conftest.results()."""
    sys.stdout.write("KOLO-RESULT " + json.dumps(obj) + "\n")
    sys.stdout.flush()


class Cases:
    """Runs named test cases and reports each as {"case", "ok", "detail"}:
    fn() (or fn(case) with pass_case) returns None for a pass or a failure
    description; an exception is a failure with its traceback. count is the
    number of cases run."""

    def __init__(self, pass_case=False, limit=4):
        self.count = 0
        self.pass_case = pass_case
        self.limit = limit

    def run(self, case, fn):
        import traceback

        self.count += 1
        try:
            detail = fn(case) if self.pass_case else fn()
        except Exception:
            detail = "raised: " + traceback.format_exc(limit=self.limit)
        report({"case": case, "ok": detail is None, "detail": detail})
