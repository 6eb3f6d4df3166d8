"""Results on a full disk or in a directory that takes no files: one `StorageError` naming the file
or directory, and the results already there stay whole (`bench.report`)."""

import errno
import os

import pytest

from specpilot.bench import report
from specpilot.errors import StorageError


def test_a_full_disk_keeps_the_previous_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    path.write_text('{"old": true}\n')
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, fd, *args, **kwargs):
            self.f = real_fdopen(fd, *args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report.os, "fdopen", Full)
    with pytest.raises(StorageError, match=f"cannot write {path}: no space left on device"):
        report.write_text_atomic(path, '{"new": true}\n')
    assert path.read_text() == '{"old": true}\n' and sorted(tmp_path.iterdir()) == [path]  # no temporary left


def test_a_results_directory_that_takes_no_files_is_refused_before_timing(tmp_path, monkeypatch):
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and os.fsdecode(path).startswith(str(tmp_path)):
            raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(StorageError, match=f"cannot write the results directory {tmp_path / 'out'}: read-only"):
        report.prepare_out_dir(tmp_path / "out", "fixture")


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_a_report_file_gets_the_mode_of_the_users_umask(tmp_path, umask):
    """write_text_atomic's temporary file is private (mkstemp); the report it becomes is not."""
    import stat

    before = os.umask(umask)
    try:
        report.write_text_atomic(tmp_path / "results.json", "{}\n")
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "results.json").stat().st_mode) == 0o666 & ~umask
