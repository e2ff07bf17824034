"""The watchdog's logic and the bounded helper thread, on the CPU.

The watchdog follows a communicator through its :class:`CommState`: events that answer
``query()``, NCCL's asynchronous error through ``poll()`` and ``abort(reason)``. Here those are
plain Python objects whose answers the test sets, and the clock is the test's, so each rule
(overdue collective, asynchronous error, stuck blocking call, a call in flight) is checked
exactly; one test runs the real thread on the real clock."""

from __future__ import annotations

import threading
import time

import pytest

from shimrt import CollectiveError, ShimrtError
from shimrt.nccl import watchdog as wd
from shimrt.nccl.group import bounded


class Marker:
    """An event as the watchdog uses it: recorded on a stream, then done or not."""

    def __init__(self):
        self.done, self.streams = False, []

    def record(self, stream):
        self.streams.append(stream)
        self.done = False

    def query(self):
        if isinstance(self.done, Exception):
            raise self.done
        return self.done

    def close(self):
        self.closed = True


class Comm:
    """What the watchdog calls back: NCCL's asynchronous state and abort."""

    def __init__(self, timeout=10.0, blocking=True, own=None):
        self.async_state, self.aborted, self.made = 0, [], []
        self.state = wd.CommState("handle", timeout=timeout, blocking=blocking, new_event=self.new_event,
                                  poll=lambda: self.async_state, abort=self.abort, name="test communicator",
                                  own=own)

    def new_event(self):
        self.made.append(Marker())
        return self.made[-1]

    def abort(self, reason):
        self.aborted.append(reason)
        self.state.take_handle(None)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def dog():
    clock = Clock()
    d = wd.Watchdog(clock, abort_in_thread=False, looks_itself=False)  # the test looks, on its own clock
    return d, clock


def test_a_collective_that_outlives_its_timeout_aborts_the_communicator(dog):
    d, clock = dog
    c = Comm(timeout=10)
    d.register(c.state)
    with c.state.lock:
        c.state.follow("stream-a", "all_reduce", clock.now)
    clock.now += 9.9
    assert d.check() == [] and c.aborted == []
    clock.now += 0.2
    (state, reason), = d.check()
    assert state is c.state and len(c.aborted) == 1
    assert "all_reduce enqueued 10.1 s ago had not finished within the timeout of 10 s" in reason
    assert isinstance(c.state.error, CollectiveError) and "watchdog aborted the test communicator" in str(c.state.error)
    assert c.state.dead() is c.state.error  # the next use raises why
    assert d.watched() == []  # an aborted communicator is no longer followed


def test_finished_collectives_are_dropped_and_their_events_reused(dog):
    d, clock = dog
    c = Comm(timeout=1)
    d.register(c.state)
    for _ in range(3):
        with c.state.lock:
            c.state.follow("s", "all_reduce", clock.now)
    for m in c.made:
        m.done = True
    clock.now += 100  # long past the timeout, but finished: nothing to abort
    assert d.check() == [] and not c.state.pending
    with c.state.lock:
        c.state.follow("s", "broadcast", clock.now)
    assert len(c.made) == 3  # a spare event was reused
    assert c.state.pending[0][2] == "broadcast"


def test_only_the_oldest_unfinished_collective_counts(dog):
    d, clock = dog
    c = Comm(timeout=5)
    d.register(c.state)
    with c.state.lock:
        c.state.follow("s1", "first", clock.now)
        clock.now += 4
        c.state.follow("s2", "second", clock.now)
    c.made[0].done = True  # the first finished; the second is 4 s younger
    clock.now += 2
    assert d.check() == []
    clock.now += 3.5
    (_, reason), = d.check()
    assert reason.startswith("second enqueued 5.5 s ago")


def test_an_asynchronous_nccl_error_aborts_at_once(dog):
    d, _ = dog
    c = Comm()
    d.register(c.state)
    c.async_state = 7  # ncclInProgress: a non-blocking call settling, not an error
    assert d.check() == []
    c.async_state = 6  # ncclRemoteError
    (_, reason), = d.check()
    assert "asynchronous error (6)" in reason and c.aborted


def test_a_call_in_flight_is_left_alone_until_it_is_stuck(dog):
    d, clock = dog
    c = Comm(timeout=10)
    d.register(c.state)
    with c.state.lock:
        c.state.follow("s", "all_reduce", clock.now - 100)  # overdue, but a call holds the lock
    entered, release = threading.Event(), threading.Event()

    def in_nccl():
        with c.state.lock:
            c.state.call, c.state.entered = "ncclAllReduce", clock.now
            entered.set()
            release.wait(10)

    t = threading.Thread(target=in_nccl)
    t.start()
    entered.wait(10)
    try:
        assert d.check() == [] and c.aborted == []  # the look waits for the call to end
        clock.now += 10.5
        (_, reason), = d.check()  # a blocking call past its timeout: aborted without the lock
        assert "ncclAllReduce did not return within 10 s" in reason
    finally:
        release.set()
        t.join(10)


def test_a_non_blocking_call_is_bounded_by_its_own_poll_not_by_the_watchdog(dog):
    d, clock = dog
    c = Comm(timeout=1, blocking=False)
    d.register(c.state)
    c.state.call, c.state.entered = "ncclGroupEnd", clock.now - 50
    assert c.state.stuck(clock.now) is None
    assert d.check() == []


def test_a_failure_while_looking_aborts_with_that_reason(dog):
    d, clock = dog
    c = Comm()
    d.register(c.state)
    with c.state.lock:
        c.state.follow("s", "all_gather", clock.now)
    c.made[0].done = ShimrtError("cuEventQuery failed: CUDA_ERROR_ILLEGAL_ADDRESS")
    (_, reason), = d.check()
    assert "following its collectives failed" in reason and "ILLEGAL_ADDRESS" in reason


def test_an_abort_that_fails_is_said_on_the_next_use(dog):
    d, _ = dog
    c = Comm()

    def stuck_abort(reason):
        raise CollectiveError("ncclCommAbort did not complete within 10 s")
    c.state.abort = stuck_abort
    d.register(c.state)
    c.async_state = 3
    d.check()
    assert "asynchronous error (3)" in str(c.state.error) and "ncclCommAbort did not complete" in str(c.state.error)


def test_a_release_that_would_wait_for_the_gpu_waits_for_another_thread_not_the_look(dog):
    """On an H100 at db6b765 the watchdog, aborting with the communicator's lock held, ran a collected
    module's unload, which waited for the stuck collective the abort was to end. Here a collected
    resource whose release waits 5 s is dropped during the look (in the abort): the look and the
    abort return at once, and the release runs at the next release on another thread."""
    from shimrt.lifetime import finalizer

    class Held:
        pass
    released, gate = [], threading.Event()

    def release(name):
        gate.wait(5)
        released.append(name)
    d, _ = dog
    c = Comm()

    def abort(reason):
        held = Held()
        finalizer(held, release, "collected during the abort")
        del held  # collected here, on the looking thread
        c.aborted.append(reason)
    c.state.abort = abort
    d.register(c.state)
    c.async_state = 3
    t0 = time.monotonic()
    assert len(d.check()) == 1 and len(c.aborted) == 1
    assert time.monotonic() - t0 < 1 and released == []
    gate.set()
    other = Held()
    finalizer(other, released.append, "the next one")()
    assert released == ["collected during the abort", "the next one"]


def test_a_tight_loop_keeps_the_followed_collectives_bounded():
    c = Comm()
    for i in range(10 * wd.REAP_AT):
        with c.state.lock:
            c.state.follow("s", "all_reduce", float(i))
        c.state.pending[-1][0].done = True  # each finishes before the next is enqueued
    assert len(c.state.pending) <= wd.REAP_AT and len(c.made) <= wd.REAP_AT + 1


def test_a_loop_that_waits_each_step_reuses_one_event_and_closing_releases_them():
    c = Comm()
    for i in range(100):
        with c.state.lock:
            c.state.follow("s", "all_reduce", float(i))
        c.state.pending[-1][0].done = True  # the step waited for it
    assert len(c.made) == 1  # recycled as soon as it finished
    c.state.release()
    assert not c.state.pending and all(getattr(m, "closed", False) for m in c.made)


def test_back_to_back_collectives_on_its_own_stream_share_an_event_and_the_tail_is_covered(dog):
    d, clock = dog
    c = Comm(timeout=10, own="own")
    d.register(c.state)
    with c.state.lock:
        c.state.follow("own", "first", clock.now)  # an event
        c.state.follow("own", "second", clock.now + wd.GAP / 4)  # within the gap: the tail
        c.state.follow("own", "third", clock.now + wd.GAP / 2)
        c.state.follow("other", "elsewhere", clock.now + wd.GAP / 2)  # another stream: its own event
    # the tail names its oldest collective, with when it was enqueued (the later ones add nothing to it)
    assert len(c.made) == 2 and c.state.tail == ("own", clock.now + wd.GAP / 4, "second")
    c.made[0].done = c.made[1].done = True
    clock.now += 1
    assert d.check() == [] and c.state.tail is None  # the look covered the tail with an event
    assert len(c.state.pending) == 1 and c.state.pending[0][1:] == (clock.now - 1 + wd.GAP / 4, "second")
    clock.now += 9.1  # 10.1 s after the second collective was enqueued, which the tail's event covers
    (_, reason), = d.check()
    assert reason.startswith("second enqueued 10.1 s ago")


def test_a_collective_after_the_gap_gets_its_own_event_counted_from_the_tail():
    c = Comm(own="own")
    with c.state.lock:
        c.state.follow("own", "a", 0.0)
        c.state.follow("own", "b", wd.GAP / 2)
        c.state.follow("own", "c", 2 * wd.GAP)
    assert [p[1:] for p in c.state.pending] == [(0.0, "a"), (wd.GAP / 2, "c")] and c.state.tail is None


def test_the_handle_is_taken_once():
    c = Comm()
    assert c.state.take_handle(None) == "handle"
    assert c.state.take_handle(None) is None
    assert "closed or was aborted" in str(c.state.dead())


def test_the_pause_follows_the_shortest_timeout(dog):
    d, _ = dog
    assert d.pause() == wd.LONGEST_PAUSE
    d.register(Comm(timeout=2).state)
    assert d.pause() == pytest.approx(2 / wd.LOOKS_PER_TIMEOUT)
    d.register(Comm(timeout=0.01).state)
    assert d.pause() == wd.SHORTEST_PAUSE


def test_the_thread_aborts_an_overdue_collective_on_the_real_clock():
    d = wd.Watchdog()
    c = Comm(timeout=0.2)
    with c.state.lock:
        c.state.follow("s", "all_reduce", time.monotonic())
    t0 = time.monotonic()
    d.register(c.state)  # starts the thread
    while not c.aborted and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    took = time.monotonic() - t0
    assert c.aborted and 0.2 <= took < 1.0, took
    assert d.alive  # and as a daemon: it never keeps the interpreter from exiting
    assert all(t.daemon for t in threading.enumerate() if t.name == "shimrt NCCL watchdog")


def test_a_slow_abort_does_not_hold_up_the_others():
    d = wd.Watchdog(Clock(), looks_itself=False)
    release = threading.Event()
    slow, quick = Comm(), Comm()
    slow.state.abort = lambda reason: release.wait(30)
    slow.async_state = quick.async_state = 6
    d.register(slow.state)
    d.register(quick.state)
    t0 = time.monotonic()
    assert len(d.check()) == 2
    while not quick.aborted and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    assert time.monotonic() - t0 < 5 and quick.aborted  # the slow one's abort runs on a thread of its own
    assert "watchdog aborted" in str(slow.state.error)  # and its next use raises at once
    release.set()


def test_the_thread_lives_on_after_a_look_or_an_abort_that_raises_anything():
    """A look whose event raises something other than a shimrt error, and an abort that raises,
    leave the thread running: the next communicator is still aborted on time."""
    d = wd.Watchdog()
    odd, later = Comm(timeout=0.2), Comm(timeout=0.2)
    odd.state.abort = lambda reason: (_ for _ in ()).throw(RuntimeError("abort broke"))
    with odd.state.lock:
        odd.state.follow("s", "all_reduce", time.monotonic())
    odd.made[0].done = TypeError("query broke")
    d.register(odd.state)
    t0 = time.monotonic()
    while "abort broke" not in str(odd.state.error) and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    assert "query broke" in str(odd.state.error) and "abort broke" in str(odd.state.error)
    with later.state.lock:
        later.state.follow("s", "all_gather", time.monotonic())
    d.register(later.state)
    t0 = time.monotonic()
    while not later.aborted and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    assert later.aborted and d.alive and d.failures == 0


def test_the_process_has_one_watchdog():
    assert wd.watchdog() is wd.watchdog()


def test_bounded_returns_the_result_or_raises_what_the_call_raised():
    assert bounded(lambda: 42, "answer", 5) == 42
    with pytest.raises(KeyError, match="nope"):
        bounded(lambda: {}["nope"], "lookup", 5)


def test_bounded_gives_up_after_the_timeout_and_leaves_the_thread():
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(CollectiveError, match=r"ncclCommInitRankConfig did not complete within 0.2 s \(is every"):
        bounded(lambda: release.wait(30), "ncclCommInitRankConfig", 0.2, " (is every rank running?)")
    assert time.monotonic() - t0 < 2
    assert any(t.name == "shimrt ncclCommInitRankConfig" for t in threading.enumerate())
    release.set()


def test_the_abort_helper_thread_of_a_never_waiting_caller_leaves_a_waiting_release_until_after_the_abort():
    """The watchdog's abort thread calls ncclCommAbort through bounded()'s helper thread. A release
    the watchdog left (a module unload that waits for the stuck kernel) must not run on that helper
    before the abort that ends the kernel: the helper is never-waiting too."""
    import gc

    from shimrt.lifetime import finalizer, never_waiting
    kernel_ended = threading.Event()

    class Held:
        pass

    def abort():  # a collection on the helper before the ctypes call, then the abort ends the kernel
        held = Held()
        held.me = held
        finalizer(held, lambda: None)
        del held
        gc.collect()
        kernel_ended.set()
        return "aborted"
    said = []

    def abort_thread():
        with never_waiting():
            left = Held()
            finalizer(left, kernel_ended.wait, 30)  # collected here: left for later
            del left
            t0 = time.monotonic()
            said.append((bounded(abort, "ncclCommAbort", 5.0), time.monotonic() - t0))
    t = threading.Thread(target=abort_thread)
    t.start()
    t.join(40)
    (result, took), = said
    assert result == "aborted" and took < 2, said
