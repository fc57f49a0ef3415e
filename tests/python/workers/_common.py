"""Helpers for worker scripts run by the Python tests."""

import json
import sys


def report(obj):
    """One line the test reads back with conftest.results()."""
    sys.stdout.write("KOLO-RESULT " + json.dumps(obj) + "\n")
    sys.stdout.flush()
