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
