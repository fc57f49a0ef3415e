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


def adasum_ref(vectors):
    """The Adasum of the ranks' vectors over kolo's tree, in float64 numpy:
    with p the largest power of two <= n, ranks 2i and 2i+1 (i < n - p)
    combine first, then the p survivors at distance 1, 2, 4, ...; in every
    pair the lower rank's vector is a. combine(a, b) = (1 - a.b/2|a|^2) a +
    (1 - a.b/2|b|^2) b, a coefficient 1 where its squared norm is < 1e-8."""
    import numpy as np

    def combine(a, b):
        dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
        ca = 1 - dot / aa / 2 if aa >= 1e-8 else 1.0
        cb = 1 - dot / bb / 2 if bb >= 1e-8 else 1.0
        return ca * a + cb * b

    v = [np.asarray(x, dtype=np.float64).ravel() for x in vectors]
    n = len(v)
    p = 1
    while p * 2 <= n:
        p *= 2
    e = n - p
    live = [combine(v[2 * i], v[2 * i + 1]) for i in range(e)] + v[2 * e:]
    d = 1
    while d < p:
        live = [combine(live[i], live[i + d]) if i % (2 * d) == 0 else live[i]
                for i in range(p)]
        d *= 2
    return live[0]
