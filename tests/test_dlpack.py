"""DLPack export and import through ctypes, checked with numpy as a real consumer and producer."""

from __future__ import annotations

import gc

import numpy as np

from shimrt import dlpack


class Exported:
    """Exports host memory through shimrt's exporter (device type CPU, so numpy can consume it)."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return (dlpack.CPU, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return dlpack.export(self, self.array.ctypes.data, self.array.shape, self.array.dtype, (dlpack.CPU, 0))


def test_numpy_consumes_an_exported_tensor_without_copying():
    for dtype in (np.float32, np.float64, np.int8, np.uint16, np.int64):
        base = (np.arange(24) * 3).astype(dtype).reshape(2, 3, 4)
        view = np.from_dlpack(Exported(base))
        assert view.dtype == base.dtype and view.shape == base.shape
        np.testing.assert_array_equal(view, base)
        base[1, 2, 3] = 7
        assert view[1, 2, 3] == 7


def test_consumed_and_unconsumed_capsules_release_their_owner():
    gc.collect()
    before = dlpack.live_exports()
    owner = Exported(np.ones(5))
    view = np.from_dlpack(owner)
    assert dlpack.live_exports() == before + 1
    del view
    gc.collect()
    assert dlpack.live_exports() == before
    capsule = owner.__dlpack__()
    assert dlpack.live_exports() == before + 1
    del capsule
    gc.collect()
    assert dlpack.live_exports() == before


def test_data_pointer_reads_a_producers_capsule():
    a = np.arange(10, dtype=np.float32)
    assert dlpack.data_pointer(a) == a.ctypes.data
    assert dlpack.data_pointer(a[3:]) == a.ctypes.data + 12
    assert dlpack.device_of(a) == (dlpack.CPU, 0)
