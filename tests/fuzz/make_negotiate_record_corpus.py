#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_negotiate_record: negotiation messages made
of valid records, encoded as fusion/record.c does (fusion_internal.h has the
format; host byte order, little-endian on the machines kolo runs on).

    /usr/bin/python3 tests/fuzz/make_negotiate_record_corpus.py [DIR]
"""
import os
import struct
import sys

# fusion.h, include/kolo/kolo.h
ALLREDUCE, GROUP, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, JOIN, EXCLUSIVE = range(1, 10)
UINT8, INT64, FLOAT16, FLOAT32 = 1, 3, 4, 6
SUM, AVERAGE, MAX = 0, 1, 3
ETIMEDOUT, EMISMATCH = 2, 12
REQUEST, PARAMS, FAIL = 1, 2, 3


def string(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def request(name, kind, dtype=FLOAT32, op=SUM, root=0, pre=1.0, post=1.0, counts=(1,)):
    return (struct.pack("<BBBBIddI", REQUEST, kind, dtype, op, root, pre, post, len(counts))
            + b"".join(struct.pack("<Q", c) for c in counts) + string(name))


def params(threshold, cycle_ms):
    return struct.pack("<BQd", PARAMS, threshold, cycle_ms)


def fail(status, name, why):
    return struct.pack("<BB", FAIL, status) + string(name) + string(why)


SEEDS = {
    "allreduce": request("layer1.weight", ALLREDUCE, counts=(1024,)),
    "average_scaled": request("grad.bias", ALLREDUCE, FLOAT16, AVERAGE, pre=0.5, post=2.0,
                              counts=(7,)),
    "group": request("group:a,b,c", GROUP, counts=(3, 0, 5)),
    "allgather": request("gather.x", ALLGATHER, INT64, counts=(9,)),
    "alltoall": request("a2a", ALLTOALL, UINT8, counts=(1, 2, 3, 4)),
    "broadcast": request("params.0", BROADCAST, root=2, counts=(16,)),
    "reducescatter": request("rs", REDUCESCATTER, op=MAX, counts=(10,)),
    "barrier_join": request("kolo.barrier.0", BARRIER, 0, counts=())
    + request("kolo.join.0", JOIN, 0, counts=()),
    "params": params(64 << 20, 3.5),
    "fail": fail(ETIMEDOUT, "layer1.weight", "'layer1.weight' stalled; missing: rank 1"),
    "rank0_mixed": params(1 << 20, 0.0) + fail(EMISMATCH, "x", "ranks disagree")
    + request("x", ALLREDUCE, counts=(4,)) + request("y", ALLREDUCE, counts=(4,)),
    # Valid records, refused as a message: a name announced twice by one rank.
    "announced_twice": request("x", ALLREDUCE, counts=(4,)) + request("x", ALLREDUCE, counts=(4,)),
    # ... unless rank 0 failed it in between.
    "failed_then_again": request("x", ALLREDUCE, counts=(4,)) + fail(EMISMATCH, "x", "no")
    + request("x", ALLREDUCE, counts=(4,)),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "corpus", "negotiate_record")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
