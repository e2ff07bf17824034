"""shimrt.lifetime: the one release of a driver resource, and keep_open for one other code may
still use during its own teardown."""

from __future__ import annotations

import gc

from shimrt.lifetime import Owning, finalizer


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
