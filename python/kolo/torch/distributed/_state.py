"""State shared by the modules of kolo.torch.distributed."""

from __future__ import annotations

import threading
from typing import Any, List, Optional

# Python halves of the trampoline objects (stores, groups) stay referenced
# here: once only C++ holds one, pybind11 lets its Python half go and a call
# into it fails ("pure virtual function") or hangs.
stores: List[Any] = []
groups: List[Any] = []
lock = threading.RLock()

# Failures seen by any kolo group of this process: elastic_run uses them to
# tell a collective's failure from the training function's own errors.
failure_count = 0
last_failure: Optional[BaseException] = None


def note_failure(exc: BaseException) -> None:
    global failure_count, last_failure
    with lock:
        failure_count += 1
        last_failure = exc
