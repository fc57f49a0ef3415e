"""``python -m kolo._run_worker DIR``: one worker of :func:`kolo.run`
(started by kolorun); see :func:`kolo.runner.worker_main`."""

import sys

from kolo.runner import worker_main

if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
