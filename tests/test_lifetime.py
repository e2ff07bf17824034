"""shimrt.lifetime: the one release of a driver resource, and keep_open for one other code may
still use during its own teardown."""

from __future__ import annotations

import gc
import threading

from shimrt.lifetime import Owning, finalizer, never_waiting


class Resource(Owning):
    def __init__(self, released: list, name: str):
        self._finalizer = finalizer(self, released.append, name)

    def close(self) -> None:
        self._finalizer()


def test_a_resource_is_released_once_on_close_and_not_again_when_collected():
    released: list = []
    r = Resource(released, "a")
    r.close()
    r.close()
    del r
    gc.collect()
    assert released == ["a"]


def test_a_resource_is_released_when_collected_unclosed():
    released: list = []
    Resource(released, "b")
    gc.collect()
    assert released == ["b"]


def test_keep_open_means_never_released_by_close_collection_or_with():
    released: list = []
    r = Resource(released, "c")
    r.keep_open()
    with r:
        pass
    r.close()
    del r
    gc.collect()
    assert released == []


def test_a_never_waiting_thread_leaves_collected_releases_to_the_next_release_on_another_thread():
    released: list = []

    def drop():
        with never_waiting():
            Resource(released, "d")  # collected at once, on this thread
            gc.collect()
        assert released == []
        Resource(released, "e")  # out of the block: released now, and what was left first
        gc.collect()
    t = threading.Thread(target=drop)
    t.start()
    t.join()
    assert released == ["d", "e"]


def test_releases_that_collections_start_inside_other_releases_never_wait_on_each_other(tmp_path):
    """A release run while another is under way on the same thread (a collection starting in its
    bookkeeping) must not wait on it: cyclic garbage with finalizers, collected often, beside
    explicit releases, on a thread that releases and on one that leaves them, in a process of
    its own that must end within its timeout."""
    import subprocess
    import sys
    script = tmp_path / "churn.py"
    script.write_text("""
import gc, threading
from shimrt.lifetime import finalizer, never_waiting
class Owner: pass
released = []
def churn(n, tag):
    for i in range(n):
        o = Owner(); o.me = o
        finalizer(o, released.append, (tag, i))
        del o
        finalizer(Owner(), released.append, ("explicit", tag, i))()
gc.set_threshold(700)
churn(20000, "main")
def leaving():
    with never_waiting():
        churn(5000, "left")
t = threading.Thread(target=leaving); t.start(); t.join()
churn(10, "after")
gc.collect()
names = [r for r in released]
assert len(names) == len(set(names)) == 2 * 25010, len(names)
print("ok")
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
