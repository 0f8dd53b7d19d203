"""run_workers: gloo ranks on CPU return the right values, and every failure ends, never hangs."""

import functools
import os
import time

import pytest

torch = pytest.importorskip("torch")

from mha.parallel import _launch_examples as ex  # noqa: E402
from mha.parallel.launch import run_workers  # noqa: E402


def left_neighbour_by_hand(rank: int, world_size: int) -> list[float]:
    """What rank receives in one ring step: rank - 1's tensor, written out by hand."""
    left = (rank - 1) % world_size
    return [10.0**left + i * (left + 1) for i in range(3)]


@pytest.mark.parametrize("world_size", [2, 4])
def test_all_reduce_equals_the_sum_in_the_parent(world_size):
    """Each rank's all_reduce equals the sum of all ranks' tensors, computed here in a loop."""
    out = run_workers(ex.all_reduce_sum, world_size, timeout_s=30)
    expected = [sum(10.0**r + i * (r + 1) for r in range(world_size)) for i in range(3)]
    assert len(out) == world_size, f"one result per rank expected, got {len(out)}"
    for rank, x in enumerate(out):
        assert x.tolist() == expected, f"rank {rank}: all_reduce gave {x.tolist()}, want {expected}"


def test_ring_step_returns_the_left_neighbours_tensor():
    """batch_isend_irecv to rank+1 from rank-1: rank r ends up holding rank r-1's tensor."""
    out = run_workers(ex.ring_step, 4, timeout_s=30)
    for rank, x in enumerate(out):
        want = left_neighbour_by_hand(rank, 4)
        assert x.tolist() == want, f"rank {rank} received {x.tolist()}, want rank {rank - 1}'s {want}"


def test_a_rank_that_raises_is_named_with_its_error_and_traceback():
    """ValueError on rank 2 of 4 -> one RuntimeError starting with that rank and the message."""
    with pytest.raises(RuntimeError) as info:
        run_workers(ex.fail_on, 4, args=(2, "planted failure 42"), timeout_s=30)
    text = str(info.value)
    assert text.startswith("rank 2 of 4 failed: ValueError: planted failure 42"), text
    assert "in fail_on" in text, f"the rank's traceback should be in the message: {text}"


def test_a_rank_that_dies_without_a_word_is_named():
    """Rank 1 calls os._exit(3) (like a segfault, no exception): named, with its exit code."""
    with pytest.raises(RuntimeError, match=r"^rank 1 of 2 failed: ProcessExited: .* code 3 "):
        run_workers(ex.exit_on, 2, args=(1, 3), timeout_s=30)


def test_tensor_results_arrive_detached_and_whole():
    """A view of a graph node arrives detached, holding only its own 2 floats, not its base's 100."""
    out = run_workers(ex.grad_result, 2, timeout_s=30)
    for rank, got in enumerate(out):
        assert got["rank"] == rank, got
        assert got["y"].tolist() == [1.0 * (rank + 1), 2.0 * (rank + 1)], got["y"]
        assert not got["y"].requires_grad, "results must come back detached"
        nbytes = got["y"].untyped_storage().nbytes()
        assert nbytes == 2 * 4, f"a cloned (2,) float32 result holds 8 bytes, this one {nbytes}"


def test_a_mismatched_collective_errors_within_the_collective_timeout():
    """Rank 0 skips the all_reduce (but stays alive): rank 1 must fail after ~5 s, not hang."""
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:  # a TimeoutError here would mean: it hung
        run_workers(ex.skip_all_reduce, 2, args=(0, 60.0), timeout_s=25, collective_timeout_s=5)
    elapsed = time.monotonic() - start
    text = str(info.value)
    assert text.startswith("rank 1 of 2 failed"), text
    assert "Timed out" in text, f"gloo's own timeout should be the cause: {text}"
    assert elapsed < 15, f"took {elapsed:.1f} s for a 5 s collective timeout"


def test_a_worker_past_the_deadline_is_named_and_killed(tmp_path):
    """Rank 1 sleeps (ignoring SIGTERM) past timeout_s: TimeoutError names it, its pid is gone."""
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        run_workers(ex.sleep_on, 2, args=(1, 60.0, str(tmp_path)), timeout_s=5)
    elapsed = time.monotonic() - start
    assert "rank(s) [1] of 2" in str(info.value), str(info.value)
    assert elapsed < 5 + 4, f"took {elapsed:.1f} s for timeout_s=5"
    pid = int((tmp_path / "1").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # signal 0 only asks whether the process exists


def nested_function():
    """A function defined inside another one: no worker can import it by name."""

    def inner(rank: int, world_size: int) -> int:
        return rank

    return inner


@pytest.mark.parametrize(
    ("fn", "world_size", "error", "phrase"),
    [
        (ex.all_reduce_sum, 0, ValueError, "world_size must be >= 1"),
        (ex.all_reduce_sum, 2.0, TypeError, "world_size must be an int"),
        (ex.all_reduce_sum, 1000, ValueError, "world_size must be <= 64"),
        (lambda rank, world_size: rank, 2, TypeError, "lambda"),
        (nested_function(), 2, TypeError, "a lambda or nested function"),
        (functools.partial(ex.fail_on, bad_rank=0), 2, TypeError, "module-level function"),
        ("all_reduce_sum", 2, TypeError, "fn must be a function, got str"),
    ],
)
def test_bad_input_raises_before_any_process_starts(fn, world_size, error, phrase):
    """Bad world_size or a function a worker cannot import: a clear error, well under a second."""
    start = time.monotonic()
    with pytest.raises(error, match=phrase):
        run_workers(fn, world_size)
    assert time.monotonic() - start < 0.5, "validation must not start processes"


def test_a_function_from_main_is_refused(monkeypatch):
    """A function defined in a notebook or script lives in __main__: refused with that reason."""
    monkeypatch.setattr(ex.rank_tensor, "__module__", "__main__")
    with pytest.raises(TypeError, match=r"defined in __main__ \(a script or a notebook\)"):
        run_workers(ex.rank_tensor, 2)


def test_unpicklable_args_are_refused():
    """Arguments travel pickled: a generator cannot, and says so before anything starts."""
    with pytest.raises(TypeError, match="args must be picklable"):
        run_workers(ex.all_reduce_sum, 2, args=((x for x in range(3)),))


def test_a_knock_on_connection_error_is_reported_after_its_cause():
    """Under load rank 1's 'Connection closed by peer' (rank 2 left) can arrive before rank 2's
    own error: the cause is still the one named first."""
    from mha.parallel.launch import _failure

    failures = [("error", 1, "RuntimeError", "Gloo connectFullMesh failed with [...] Connection "
                 "closed by peer [127.0.0.1]:58027", "traceback 1"),
                ("error", 2, "ValueError", "planted failure 42", "traceback 2")]
    text = str(_failure(failures, {1: failures[0], 2: failures[1]}, 4))
    assert text.startswith("rank 2 of 4 failed: ValueError: planted failure 42"), text
    assert "1 other rank(s) failed too: 1" in text
