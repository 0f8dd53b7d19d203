"""Small worker functions for `mha.parallel.launch.run_workers`, importable by the rank processes.

Each takes (rank, world_size, *args). They live in a module, not in a test or a notebook,
because a forkserver or spawn child imports the function by name and cannot see __main__.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist


def rank_tensor(rank: int, n: int = 3) -> torch.Tensor:
    """The tensor rank `rank` contributes: distinct per rank, so a wrong sum shows."""
    return torch.arange(n, dtype=torch.float64) * (rank + 1) + 10.0**rank  # (n,)


def all_reduce_sum(rank: int, world_size: int, n: int = 3) -> torch.Tensor:
    """all_reduce (sum) of every rank's rank_tensor."""
    x = rank_tensor(rank, n)  # (n,)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def ring_step(rank: int, world_size: int, n: int = 3) -> torch.Tensor:
    """One ring step: send rank_tensor to rank + 1, receive the one of rank - 1."""
    send, recv = rank_tensor(rank, n), torch.empty(n, dtype=torch.float64)  # (n,), (n,)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world_size),
           dist.P2POp(dist.irecv, recv, (rank - 1) % world_size)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return recv


def fail_on(rank: int, world_size: int, bad_rank: int, message: str) -> int:
    """Raise ValueError(message) on bad_rank; the others return their rank."""
    if rank == bad_rank:
        raise ValueError(message)
    return rank


def skip_all_reduce(rank: int, world_size: int, skip_rank: int, stall_s: float) -> int:
    """A mismatched collective: skip_rank skips the all_reduce and stays alive for stall_s."""
    if rank == skip_rank:
        time.sleep(stall_s)  # alive but absent: the others must time out, not see a closed peer
        return rank
    dist.all_reduce(torch.ones(1))
    return rank


def sleep_on(rank: int, world_size: int, slow_rank: int, seconds: float, pid_dir: str) -> int:
    """slow_rank writes its pid to pid_dir/<rank>, ignores SIGTERM and sleeps; others return."""
    if rank != slow_rank:
        return rank
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # so only the SIGKILL can stop it
    with open(os.path.join(pid_dir, str(rank)), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)
    return rank


def exit_on(rank: int, world_size: int, bad_rank: int, code: int) -> int:
    """bad_rank ends its process at once with exit code `code` (as a crash would): no report."""
    if rank == bad_rank:
        os._exit(code)
    return rank


def grad_result(rank: int, world_size: int) -> dict:
    """A result pickle would send with its graph flag and its base's whole storage: a view."""
    x = torch.arange(100.0, requires_grad=True)  # (100,)
    return {"rank": rank, "y": (x * (rank + 1))[1:3]}  # a (2,) view of a graph node


def disagreeing_ranks(rank: int, world_size: int, facts_of_rank: list[dict]) -> str:
    """Rank r states facts_of_rank[r]; return the error check_ranks_agree raises here (or "agreed")."""
    from mha.parallel import ring as parallel

    try:
        parallel.check_ranks_agree(**facts_of_rank[rank])
    except ValueError as exc:
        return str(exc)
    return "agreed"
