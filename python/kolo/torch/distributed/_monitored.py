"""monitored_barrier on backend kolo: a barrier that names the ranks that did
not reach it in time, built on kolo's point-to-point.

Every rank sends rank 0 a token carrying its barrier number; rank 0 waits
for them until the deadline and answers every rank with the list of ranks
that did not arrive (empty: passed). So every rank that arrived fails
naming the culprits, where gloo's ranks other than 0 only point to rank 0's
log. Messages use a tag of kolo's own range (one per group) and carry the
barrier number: a token or an answer that comes after its barrier failed is
told apart from the current one, and a late rank learns that its barrier
already failed. A recv that timed out stays posted and is taken up by the
next barrier, so nothing is lost or matched twice."""

from __future__ import annotations

import time
import zlib
from typing import Any, Dict, List

import torch
import torch.distributed as dist

import kolo

from ._common import _timeout_s

# kolo's own point-to-point tags are at and below -2**30; a group's monitored
# barrier takes TAG minus the group's number.
TAG = -(2**30)
GRACE_S = 2.0


def _error(msg: str) -> BaseException:
    cls = getattr(dist, "DistBackendError", RuntimeError)
    return cls(f"kolo: monitored_barrier: {msg}")


class _Mailbox:
    """One posted recv per peer, kept across barriers."""

    def __init__(self, words: int, tag: int, comm: Any = None):
        self.words, self.tag, self.comm = words, tag, comm
        self.posted: Dict[int, tuple] = {}

    def next(self, peer: int, left_s: float) -> Any:
        """The next message from peer (a tensor), None when none came in time."""
        if peer not in self.posted:
            buf = torch.zeros(self.words, dtype=torch.int64)
            self.posted[peer] = (kolo.recv_async(buf, peer, self.tag, comm=self.comm), buf)
        h, buf = self.posted[peer]
        if not h.wait_for(max(left_s, 0.0)):
            return None
        del self.posted[peer]
        h.wait()  # raises kolo's error when the peer failed
        return buf


class MonitoredBarrier:
    """The state of one process group's monitored barriers."""

    def __init__(self, rank: int, size: int, group_id: str, comm: Any = None):
        self.rank, self.size, self.comm = rank, size, comm
        n = int(group_id) if group_id.isdigit() else zlib.crc32(group_id.encode())
        self.tag = TAG - n % 2**20
        self.seq = 0
        self.tokens = _Mailbox(1, self.tag, comm)  # on rank 0: [barrier number]
        self.answers = _Mailbox(size + 1, self.tag, comm)  # elsewhere: [number, missing..., -1]

    def __call__(self, timeout: Any, wait_all_ranks: bool) -> None:
        self.seq += 1
        seconds = _timeout_s(timeout)
        deadline = time.monotonic() + seconds
        if self.rank == 0:
            self._collect(deadline, seconds, wait_all_ranks)
        else:
            # The answer of a failed barrier leaves rank 0 at its deadline,
            # which is after this rank's: GRACE_S more to hear whom it names.
            self._arrive(deadline + GRACE_S, seconds)

    def _answer(self, peer: int, seq: int, missing: List[int]) -> None:
        msg = torch.full((self.size + 1,), -1, dtype=torch.int64)
        msg[0] = seq
        msg[1:1 + len(missing)] = torch.tensor(missing, dtype=torch.int64)
        kolo.send_async(msg, peer, self.tag, comm=self.comm)  # eager; its handle is not waited for

    def _collect(self, deadline: float, seconds: float, wait_all: bool) -> None:
        missing: List[int] = []
        failed: Dict[int, str] = {}
        for peer in range(1, self.size):
            while True:
                # Past the first absent rank, only wait_all_ranks waits on.
                left = deadline - time.monotonic() if wait_all or not missing else 0.0
                try:
                    tok = self.tokens.next(peer, left)
                except kolo.Error as e:
                    failed[peer] = str(e)
                    break
                if tok is None:
                    missing.append(peer)
                    break
                if int(tok[0]) >= self.seq:
                    break
                self._answer(peer, int(tok[0]), [peer])  # the token of a barrier that failed
        absent = sorted(set(missing) | set(failed))
        for peer in range(1, self.size):
            if peer not in failed:
                self._answer(peer, self.seq, absent)
        if absent:
            raise _error(self._report(missing, failed, seconds, wait_all))

    def _report(self, missing: List[int], failed: Dict[int, str], seconds: float,
                wait_all: bool) -> str:
        parts = []
        if missing:
            shown = missing if wait_all else missing[:1]  # as gloo's
            who = "rank" if len(shown) == 1 else "ranks"
            parts.append(f"{who} {', '.join(map(str, shown))} did not reach barrier "
                         f"{self.seq} within {seconds * 1000:.0f} ms")
        parts += [f"rank {r} failed: {why}" for r, why in sorted(failed.items())]
        return f"[rank 0] {'; '.join(parts)}"

    def _arrive(self, deadline: float, seconds: float) -> None:
        token = torch.tensor([self.seq], dtype=torch.int64)
        try:
            kolo.send_async(token, 0, self.tag, comm=self.comm).wait()
            while True:
                ans = self.answers.next(0, deadline - time.monotonic())
                if ans is None:
                    raise _error(f"rank {self.rank} reached barrier {self.seq}, but rank 0 did "
                                 f"not answer within {seconds * 1000:.0f} ms (+{GRACE_S:.0f} s): "
                                 f"rank 0 has not reached it")
                if int(ans[0]) >= self.seq:
                    break
        except kolo.Error as e:
            raise _error(f"rank {self.rank}, barrier {self.seq}: {e}") from e
        absent = [int(r) for r in ans[1:] if r >= 0]
        if absent:
            who = ("this rank" if absent == [self.rank] else
                   f"{'rank' if len(absent) == 1 else 'ranks'} {', '.join(map(str, absent))}")
            raise _error(f"[rank {self.rank}] {who} did not reach barrier {self.seq} in time "
                         f"(as rank 0 found)")
