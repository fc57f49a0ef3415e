"""Worker of torchrun_rdzv_bench.py: initialises a gloo process group from
torchrun's environment, passes a barrier, and writes {started, initialised}
(wall times) to OUT_DIR/<rank>.json."""

import json
import os
import sys
import time

started = time.time()
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
dist.barrier()
initialised = time.time()
with open(os.path.join(sys.argv[1], f"{dist.get_rank()}.json"), "w") as f:
    json.dump({"started": started, "initialised": initialised}, f)
dist.destroy_process_group()
