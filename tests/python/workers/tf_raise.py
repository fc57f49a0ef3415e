"""Rank 1 raises while the other ranks wait for it in an allreduce inside a
tf.function: every rank must end promptly and kolorun exit non-zero. Reports
as ops_raise.py does ({"ready"}, {"raising": time}, {"failed"})."""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

import kolo.tensorflow as hvd  # noqa: E402
from _common import report  # noqa: E402

hvd.init()
r = hvd.rank()
step = tf.function(lambda x: hvd.allreduce(x, name="step"))
step(tf.ones([4]))
report({"ready": r})
if r == 1:
    report({"raising": time.time()})
    raise RuntimeError("tf_raise: rank 1 fails on purpose")
try:
    step(tf.ones([4]))
except Exception as e:
    report({"failed": type(e).__name__, "message": str(e)[:300]})
    raise
report({"completed": r})
