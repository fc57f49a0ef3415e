"""ProcessGroupKolo: a c10d process group over this process's kolo comm."""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

import kolo

from . import _state
from ._monitored import MonitoredBarrier
from ._common import BACKEND, _again, _flat, _kolo_op, _one, _real, _same, _timeout_s
from ._work import _Failure, _Op, _Work, _called_from_c10d

log = logging.getLogger("kolo.torch.distributed")


# ---- the process group ------------------------------------------------------


class ProcessGroupKolo(dist.ProcessGroup):
    """A c10d process group over a kolo comm. Made by ``init_process_group``/
    ``new_group`` with backend ``"kolo"``: the process's comm for a group of
    every rank, or (``comm``) a comm of the group's members alone, connected
    through the group's store, for a subgroup."""

    def __init__(self, rank: int, size: int, group_id: str, timeout: Any,
                 comm: Optional[kolo.Comm] = None, store: Any = None):
        super().__init__(rank, size)
        self._comm = comm
        self._store = store  # a subgroup's: its members' barrier before the comm closes
        self._gid = group_id or "0"
        self._name = self._gid
        self._desc = "undefined"
        self._timeout = timeout
        self._seq = 0
        self._issue_lock = threading.Lock()
        self._queue: "queue.Queue[Optional[_Op]]" = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition()
        self._closed: Optional[str] = None
        self._broken: Optional[BaseException] = None
        self._monitored = MonitoredBarrier(rank, size, self._gid, comm)
        self._thread = threading.Thread(target=self._complete, daemon=True,
                                        name=f"kolo-c10d-{self._gid}")
        self._thread.start()

    def __repr__(self) -> str:
        return f"ProcessGroupKolo(group {self._gid}, rank {self.rank()} of {self.size()})"

    def getBackendName(self) -> str:
        return BACKEND

    # -- names and teardown (torch calls these through its C++ trampoline) --

    def getGroupName(self) -> str:
        return self._name

    def setGroupName(self, name: str) -> None:
        self._name = str(name)

    def getGroupDesc(self) -> str:
        return self._desc

    def setGroupDesc(self, desc: str) -> None:
        self._desc = str(desc)

    def shutdown(self) -> None:
        """torch's destroy_process_group (2.7+): lets the operations in flight
        complete (bounded by the group's timeout, at most 30 s) and stops
        the completion thread."""
        self._shutdown("destroyed", min(_timeout_s(self._timeout), 30.0))

    def abort(self) -> None:
        """Stops the group without waiting for what is in flight: later calls
        raise, and the operations in flight complete with kolo's own
        timeout or membership error."""
        if not self._closed:
            self._closed = "aborted"
            self._queue.put(None)

    # -- issuing and completing --

    def _issue(self, kind: str, outputs: Any, launch: Callable[[str], list],
               finish: Optional[Callable[[list], None]] = None) -> Any:
        python_caller = _called_from_c10d()
        if self._closed:
            raise RuntimeError(f"kolo: {kind} on process group {self._gid}, which was "
                               f"{self._closed}")
        b = self._broken
        if b is not None:
            raise _again(b, f"{kind}: an earlier operation of process group {self._gid} failed")
        # Point-to-point involves two ranks, not all: it takes no number of
        # the collectives' sequence, whose names every rank must agree on.
        p2p = kind in ("send", "recv")
        with self._issue_lock:
            name = f"c10d.{self._gid}.{'p2p' if p2p else self._seq}.{kind}"
            try:
                handles = launch(name)
            except kolo.Error as e:
                self._failed(e)
                raise
            self._seq += 0 if p2p else 1
            op = _Op(name, handles, outputs, finish)
            with self._idle:
                self._pending += 1
            self._queue.put(op)
        if python_caller:
            return _Work(op)
        return _create_work_from_future(op.future)

    def _failed(self, exc: BaseException) -> None:
        _state.note_failure(exc)
        if isinstance(exc, (kolo.MembershipError, kolo.ShutdownError)) and self._broken is None:
            self._broken = exc

    def _complete(self) -> None:
        while True:
            op = self._queue.get()
            if op is None:
                return
            failure: Optional[BaseException] = None
            results = []
            for h in op.handles:
                try:
                    results.append(h.wait())
                except BaseException as e:  # noqa: B036 - every handle must be waited for
                    failure = failure or e
            op.results = results
            if failure is None and op.finish is not None:
                try:
                    op.finish(results)
                except BaseException as e:  # noqa: B036
                    failure = e
            if failure is not None:
                self._failed(failure)
                op.failure = failure
            try:
                op.inner.set_result(_Failure(failure) if failure is not None else op.outputs)
            except BaseException:  # noqa: B036 - a callback of torch's; never kill the thread
                log.exception("kolo: completing %s", op.name)
            op.done.set()
            op.handles = []
            with self._idle:
                self._pending -= 1
                if self._pending == 0:
                    self._idle.notify_all()

    def _drain(self, timeout_s: float) -> bool:
        """Waits until every issued operation has completed; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _shutdown(self, why: str, timeout_s: float = 30.0) -> bool:
        """Stops the completion thread after the operations in flight
        (bounded); later calls raise. Returns whether it drained."""
        if self._closed:
            return True
        drained = self._drain(timeout_s)
        self._closed = why
        self._queue.put(None)
        if drained:
            self._thread.join(5.0)
        if self._comm is not None:
            self._free_comm(drained, timeout_s)
        return drained

    def _free_comm(self, drained: bool, timeout_s: float) -> None:
        """A subgroup's comm closes once every member is done with it (a
        barrier through the group's store, bounded), or at once after a
        failure."""
        comm, self._comm = self._comm, None
        ok = drained and self._broken is None
        if ok:
            # set and wait only: a kolo:// store's add is a collective of
            # every rank of the job, and only the members get here.
            try:
                self._store.set(f"kolo/subgroup/free/{self.rank()}", b"1")
                self._store.wait([f"kolo/subgroup/free/{r}" for r in range(self.size())],
                                 datetime.timedelta(seconds=timeout_s))
            except Exception:  # noqa: BLE001 - the store's host may be gone, or a member
                ok = False
        kolo.comm_free(comm, abort=not ok)

    # -- collectives --

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        op = _kolo_op(opts)
        t = _flat(_one(tensors, "allreduce"), "allreduce tensor", op)
        return self._issue("allreduce", tensors,
                           lambda n: [kolo.allreduce_async(t, name=n, op=op, comm=self._comm)])

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        op = _kolo_op(opts)
        flats = [_flat(x, f"allreduce_coalesced tensor {i}", op) for i, x in enumerate(tensors)]
        if not flats:
            raise ValueError("kolo: allreduce_coalesced of no tensors")

        def launch(n: str) -> list:
            if len({f.dtype for f in flats}) == 1:
                return [kolo.grouped_allreduce_async(flats, name=n, op=op, comm=self._comm)]
            return [kolo.allreduce_async(f, name=f"{n}.{i}", op=op, comm=self._comm)
                    for i, f in enumerate(flats)]

        return self._issue("allreduce_coalesced", tensors, launch)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        if opts is not None and opts.rootTensor != 0:
            raise ValueError("kolo: broadcast takes one tensor per process (rootTensor 0)")
        self._check_root(root, "broadcast")
        t = _flat(_one(tensors, "broadcast"), "broadcast tensor")
        return self._issue("broadcast", tensors,
                           lambda n: [kolo.broadcast_async(t, root, name=n, comm=self._comm)])

    def _check_root(self, root: int, what: str) -> None:
        if not 0 <= root < self.size():
            raise ValueError(f"kolo: {what} root {root} is not a rank of this group "
                             f"(size {self.size()})")

    def _gather_flat(self, t: torch.Tensor, name: str, out: Optional[torch.Tensor]) -> list:
        """Allgathers t straight into out (flat, size * t elements; a new
        tensor when None). Counts are checked in finish: a rank that sent
        more than its share fails the op in kolo (the output is too small)."""
        if out is None:
            out = torch.empty(self.size() * t.numel(), dtype=t.dtype, device=t.device)
        return [kolo.allgather_into_async(t, out, name=name, comm=self._comm)]

    def _counts_equal(self, results: list, per_rank: int, what: str) -> torch.Tensor:
        flat, counts = results[0]
        if any(c != per_rank for c in counts):
            raise ValueError(f"kolo: {what}: the ranks sent {list(counts)} elements; every rank "
                             f"must send {per_rank}")
        return flat

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
                  opts: Any = None) -> Any:
        t = _flat(_one(input_tensors, "allgather"), "allgather input")
        outs = _one(output_tensors, "allgather")
        if len(outs) != self.size():
            raise ValueError(f"kolo: allgather needs {self.size()} output tensors, got {len(outs)}")
        for o in outs:
            _same(t, _real(o), "allgather output")
        m = t.numel()

        def finish(results: list) -> None:
            flat = self._counts_equal(results, m, "allgather")
            for r, o in enumerate(outs):
                _real(o).copy_(flat[r * m:(r + 1) * m].view(_real(o).shape))

        return self._issue("allgather", outs, lambda n: self._gather_flat(t, n, None), finish)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                        opts: Any = None) -> Any:
        t = _flat(input, "all_gather_into_tensor input")
        out = _flat(output, "all_gather_into_tensor output")
        if out.dtype != t.dtype or out.numel() != self.size() * t.numel():
            raise ValueError(f"kolo: all_gather_into_tensor: output has {out.numel()} {out.dtype} "
                             f"elements, needs {self.size() * t.numel()} {t.dtype}")
        m = t.numel()

        def finish(results: list) -> None:
            self._counts_equal(results, m, "all_gather_into_tensor")

        return self._issue("allgather_base", [output],
                           lambda n: self._gather_flat(t, n, out), finish)

    # torch >= 2.13 calls all_gather_into_tensor's backend entry by this name.
    all_gather_single = _allgather_base

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]],
                            input_list: List[torch.Tensor], opts: Any = None) -> Any:
        ins = [_flat(x, f"all_gather_coalesced input {i}") for i, x in enumerate(input_list)]
        if len(output_lists) != self.size() or any(len(o) != len(ins) for o in output_lists):
            raise ValueError(f"kolo: all_gather_coalesced needs {self.size()} output lists of "
                             f"{len(ins)} tensors")
        for outs in output_lists:
            for t, o in zip(ins, outs):
                _same(t, _real(o), "all_gather_coalesced output")

        def launch(n: str) -> list:
            return [h for i, t in enumerate(ins) for h in self._gather_flat(t, f"{n}.{i}", None)]

        def finish(results: list) -> None:
            for i, t in enumerate(ins):
                m = t.numel()
                flat = self._counts_equal(results[i:i + 1], m, "all_gather_coalesced")
                for r in range(self.size()):
                    o = _real(output_lists[r][i])
                    o.copy_(flat[r * m:(r + 1) * m].view(o.shape))

        return self._issue("allgather_coalesced", output_lists, launch, finish)

    def _reduce_scatter_flat(self, send: torch.Tensor, out: torch.Tensor, op: str,
                             what: str) -> Callable[[str], list]:
        n, r = self.size(), self.rank()
        m = out.numel()
        if send.numel() != n * m or send.dtype != out.dtype:
            raise ValueError(f"kolo: {what}: input has {send.numel()} {send.dtype} elements, "
                             f"needs {n * m} {out.dtype} ({n} blocks of the output's {m})")
        if kolo.reducescatter_count(n * m, n, r) != m:
            raise ValueError(f"kolo: {what}: {n * m} elements do not split into {n} blocks of {m}")
        return lambda name: [kolo.reducescatter_async(send, out, name=name, op=op,
                                                      comm=self._comm)]

    def reduce_scatter(self, output_tensors: List[torch.Tensor],
                       input_tensors: List[List[torch.Tensor]], opts: Any = None) -> Any:
        op = _kolo_op(opts)
        out = _flat(_one(output_tensors, "reduce_scatter"), "reduce_scatter output", op)
        ins = _one(input_tensors, "reduce_scatter")
        if len(ins) != self.size():
            raise ValueError(f"kolo: reduce_scatter needs {self.size()} input tensors, got "
                             f"{len(ins)}")
        for x in ins:
            _same(out, _real(x), "reduce_scatter input")
        send = torch.cat([_real(x).reshape(-1) for x in ins])
        return self._issue("reduce_scatter", output_tensors,
                           self._reduce_scatter_flat(send, out, op, "reduce_scatter"))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                             opts: Any = None) -> Any:
        op = _kolo_op(opts)
        out = _flat(output, "reduce_scatter_tensor output", op)
        send = _flat(input, "reduce_scatter_tensor input")
        return self._issue("reduce_scatter_base", [output],
                           self._reduce_scatter_flat(send, out, op, "reduce_scatter_tensor"))

    # torch >= 2.13 calls reduce_scatter_tensor's backend entry by this name.
    reduce_scatter_single = _reduce_scatter_base

    def _alltoall(self, send: torch.Tensor, splits: List[int], recv_counts: List[int],
                  out: Optional[torch.Tensor], what: str) -> tuple:
        if out is None:
            out = torch.empty(sum(recv_counts), dtype=send.dtype, device=send.device)

        def launch(name: str) -> list:
            return [kolo.alltoall_into_async(send, out, splits=splits, name=name,
                                             comm=self._comm)]

        def received(results: list) -> torch.Tensor:
            flat, counts = results[0]
            if list(counts) != list(recv_counts):
                raise ValueError(f"kolo: {what}: received {list(counts)} elements from the "
                                 f"ranks, expected {list(recv_counts)}")
            return flat

        return launch, received

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                      output_split_sizes: List[int], input_split_sizes: List[int],
                      opts: Any = None) -> Any:
        n = self.size()
        src = _real(input)
        dst = _real(output)
        send = _flat(input, "all_to_all_single input")
        out = _flat(output, "all_to_all_single output")
        if send.dtype != out.dtype:
            raise ValueError(f"kolo: all_to_all_single: input {send.dtype}, output {out.dtype}")

        def parts(t: torch.Tensor, sizes: List[int], what: str) -> List[int]:
            rows = t.shape[0] if t.dim() else 1
            row = t.numel() // rows if rows else 0
            if not sizes:
                if rows % n:
                    raise ValueError(f"kolo: all_to_all_single: {what} has {rows} rows, which do "
                                     f"not split into {n} equal parts; give split sizes")
                return [rows // n * row] * n
            if len(sizes) != n or any(s < 0 for s in sizes) or sum(sizes) != rows:
                raise ValueError(f"kolo: all_to_all_single: {what} split sizes {list(sizes)} must "
                                 f"be {n} counts adding up to its {rows} rows")
            return [s * row for s in sizes]

        splits = parts(src, list(input_split_sizes), "input")
        recv = parts(dst, list(output_split_sizes), "output")
        launch, received = self._alltoall(send, splits, recv, out, "all_to_all_single")

        def finish(results: list) -> None:
            received(results)

        return self._issue("alltoall_base", [output], launch, finish)

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> Any:
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"kolo: all_to_all needs {n} input and {n} output tensors")
        ins = [_real(x) for x in input_tensors]
        outs = [_real(x) for x in output_tensors]
        dtypes = {x.dtype for x in ins + outs}
        if len(dtypes) != 1:
            raise ValueError(f"kolo: all_to_all: tensors of several dtypes {sorted(map(str, dtypes))}")
        send = torch.cat([x.reshape(-1) for x in ins])
        kolo.buffer(send, "all_to_all input")
        launch, received = self._alltoall(send, [x.numel() for x in ins],
                                          [x.numel() for x in outs], None, "all_to_all")

        def finish(results: list) -> None:
            flat = received(results)
            at = 0
            for o in outs:
                o.copy_(flat[at:at + o.numel()].view(o.shape))
                at += o.numel()

        return self._issue("alltoall", output_tensors, launch, finish)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        op = _kolo_op(opts)
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "reduce")
        t = _real(_one(tensors, "reduce"))
        kolo.buffer(t, "reduce tensor", reduce=op)
        tmp = t.reshape(-1).clone()  # kolo has no reduce: an allreduce, kept by the root

        def finish(results: list) -> None:
            if self.rank() == root:
                t.view(-1).copy_(tmp)

        return self._issue("reduce", tensors,
                           lambda n: [kolo.allreduce_async(tmp, name=n, op=op,
                                                           comm=self._comm)], finish)

    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
               opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "gather")
        t = _flat(_one(input_tensors, "gather"), "gather input")
        outs: List[torch.Tensor] = []
        if self.rank() == root:
            outs = _one(output_tensors, "gather")
            if len(outs) != self.size():
                raise ValueError(f"kolo: gather needs {self.size()} output tensors on the root, "
                                 f"got {len(outs)}")
            for o in outs:
                _same(t, _real(o), "gather output")
        m = t.numel()

        def finish(results: list) -> None:
            flat = self._counts_equal(results, m, "gather")
            for r, o in enumerate(outs):
                _real(o).copy_(flat[r * m:(r + 1) * m].view(_real(o).shape))

        return self._issue("gather", output_tensors, lambda n: self._gather_flat(t, n, None),
                           finish)

    def scatter(self, output_tensors: List[torch.Tensor],
                input_tensors: List[List[torch.Tensor]], opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "scatter")
        n = self.size()
        out = _flat(_one(output_tensors, "scatter"), "scatter output")
        m = out.numel()
        if self.rank() == root:
            ins = _one(input_tensors, "scatter")
            if len(ins) != n:
                raise ValueError(f"kolo: scatter needs {n} input tensors on the root, got {len(ins)}")
            for x in ins:
                _same(out, _real(x), "scatter input")
            send = torch.cat([_real(x).reshape(-1) for x in ins])
            splits = [m] * n
        else:
            # Empty, but with a real device address when on the GPU: every rank
            # passes the same kind of memory, and a NULL pointer reads as host.
            send = (torch.empty(1, dtype=out.dtype, device=out.device)[:0] if out.is_cuda
                    else torch.empty(0, dtype=out.dtype))
            splits = [0] * n
        recv = [m if r == root else 0 for r in range(n)]
        launch, received = self._alltoall(send, splits, recv, out, "scatter")

        def finish(results: list) -> None:
            flat = received(results)
            if flat.data_ptr() != out.data_ptr():
                out.copy_(flat)

        return self._issue("scatter", output_tensors, launch, finish)

    def barrier(self, opts: Any = None) -> Any:
        return self._issue("barrier", [], lambda n: [kolo.barrier_async(self._comm)])

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """A barrier that raises on every rank that reached it, naming the
        ranks that did not within ``timeout`` (the group's by default)."""
        if self._closed:
            raise RuntimeError(f"kolo: monitored_barrier on process group {self._gid}, which "
                               f"was {self._closed}")
        self._monitored(self._timeout if timeout is None else timeout, wait_all_ranks)

    # torch asks the group of a device for its backend (init_process_group's
    # device_id, new_group): every device kolo serves is this group.
    supports_splitting = False

    def _get_backend(self, device: Any) -> Any:
        if torch.device(device).type not in ("cpu", "cuda"):
            raise RuntimeError(f"kolo: no backend for device {device} (kolo serves cpu and cuda)")
        return self

    # -- point-to-point: kolo's own endpoint per rank, beside the collectives;
    # CUDA tensors go through a host copy --

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Any:
        t = _flat(_one(tensors, "send"), "send tensor")
        host = t if t.device.type == "cpu" else t.cpu()
        return self._issue("send", tensors,
                           lambda n: [kolo.send_async(host, dst, tag, comm=self._comm)])

    def _recv(self, tensors: List[torch.Tensor], src: int, tag: int) -> tuple:
        t = _flat(_one(tensors, "recv"), "recv tensor")
        host = t if t.device.type == "cpu" else torch.empty_like(t, device="cpu")

        def finish(results: list) -> None:
            if host is not t:
                t.copy_(host)

        return (lambda n: [kolo.recv_async(host, None if src < 0 else src, tag,
                                           comm=self._comm)]), finish

    # _issue is called from the methods torch calls (it looks at its caller's caller).
    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Any:
        launch, finish = self._recv(tensors, src, tag)
        return self._issue("recv", tensors, launch, finish)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Any:
        launch, finish = self._recv(tensors, -1, tag)
        return self._issue("recv", tensors, launch, finish)
