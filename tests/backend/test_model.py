"""Loading a model: its mapped pages released without touching memory that replaced them."""

from __future__ import annotations

import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise on /proc/self/maps ranges: Linux only")
def test_page_releaser_never_touches_memory_that_replaced_an_unmapped_model_range(tmp_path):
    """llama.cpp unmaps the offloaded parts of a model's mapping before its last progress call; if
    that address range is reused at once, releasing "the model's pages" there must not zero it."""
    import ctypes
    import mmap

    from localspec.backend import MappedPageReleaser

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = 16 * mmap.PAGESIZE
    model = tmp_path / "model.gguf"
    model.write_bytes(b"\x01" * size)
    with open(model, "rb") as f:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
    assert addr not in (None, ctypes.c_void_p(-1).value)
    releaser = MappedPageReleaser(model)
    releaser._progress(0.5, None)  # mid-load: the model's pages are released (and read back on use)
    assert ctypes.string_at(addr, 4) == b"\x01" * 4
    libc.munmap(addr, size)  # llama.cpp unmaps the offloaded part ...
    MAP_FIXED_NOREPLACE = 0x100000  # ... and another allocation takes that address range
    anon = libc.mmap(addr, size, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0)
    if anon != addr:
        pytest.skip("the kernel did not give the same address back")
    ctypes.memset(anon, 0x7F, size)
    releaser._progress(1.0, None)  # the last call
    assert ctypes.string_at(anon, size) == b"\x7f" * size
    libc.munmap(anon, size)
