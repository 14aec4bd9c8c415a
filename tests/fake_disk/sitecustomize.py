"""A small disk for a real server under test (tests/api/test_storage.py): put this folder on
the server's PYTHONPATH with FAKE_DISK_DIR (its data dir) and FAKE_DISK_BYTES (the disk's size),
and shutil.disk_usage of that dir says the disk is that big and holds the data dir's files (their
sizes, read at each call): its free space moves only with what the server writes and deletes,
not with whatever else the machine's real disk is doing meanwhile."""

import os
import shutil

_DIR, _BYTES = os.environ.get("FAKE_DISK_DIR"), os.environ.get("FAKE_DISK_BYTES")


def _used(root: str) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except OSError:     # (gone meanwhile)
                pass
    return total


if _DIR and _BYTES:
    _real = shutil.disk_usage

    def disk_usage(path):
        if not os.path.realpath(path).startswith(os.path.realpath(_DIR)):
            return _real(path)
        size, used = int(_BYTES), _used(_DIR)
        return shutil._ntuple_diskusage(size, used, max(0, size - used))

    shutil.disk_usage = disk_usage
