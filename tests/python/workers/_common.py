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


# Unit roundoff of each float dtype kolo reduces in (for reference bounds).
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23,
       "float64": 2.0 ** -52}
INT_DTYPES = ("int8", "uint8", "int32", "int64")


def reduce_ref(xs, op, dtype, n, pre=1.0, post=1.0):
    """(expected, error bound) of op over the float64 inputs ``xs`` of n
    ranks, as kolo computes it in ``dtype`` (integers: exact, average
    rounded half away from zero)."""
    import numpy as np

    xs = [pre * x for x in xs]
    if op in ("sum", "average"):
        e = np.sum(xs, axis=0) * post
        mag = np.sum(np.abs(xs), axis=0) * abs(post)
        if op == "average":
            e, mag = e / n, mag / n
    elif op == "product":
        e = np.prod(xs, axis=0) * post
        mag = np.abs(e)
    else:
        e = (np.min if op == "min" else np.max)(xs, axis=0) * post
        mag = np.zeros_like(e)
    if dtype in INT_DTYPES:
        if op == "average":
            e = np.sign(e) * np.floor(np.abs(e) + 0.5)  # kolo rounds half away from zero
        return e, np.zeros_like(e)
    if dtype == "bool":
        return e, np.zeros_like(e)
    return e, 4 * n * EPS[dtype] * (mag + np.abs(e))
