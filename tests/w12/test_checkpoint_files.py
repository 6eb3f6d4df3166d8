"""W12 files: a truncated, altered or foreign file is a one-line CheckpointError, never garbage."""

import json
import os
import stat
import struct

import pytest
import torch

from specpilot.errors import CheckpointError
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint
from specpilot.w12.checkpoint import MANIFEST, read_manifest, read_w12_tensors
from specpilot.models.convert import convert_checkpoint, verify_checkpoint


@pytest.fixture
def w12_dir(tmp_path_factory, tmp_path):
    src = write_random_checkpoint(tmp_path / "src", tiny_config(num_layers=1), seed=5, dtype=torch.bfloat16)
    convert_checkpoint(src, tmp_path / "w12")
    return tmp_path / "w12"


def shard_of(path):
    (shard,) = path.glob("w12-*.safetensors")
    return shard


def data_start(shard) -> int:
    """Offset of the first tensor byte (after the 8-byte length and the JSON header)."""
    (header_len,) = struct.unpack("<Q", shard.read_bytes()[:8])
    return 8 + header_len


def shard_metadata(shard) -> dict:
    return json.loads(shard.read_bytes()[8 : data_start(shard)])["__metadata__"]


def assert_one_line_error(path, match):
    for read in (read_w12_tensors, load_model):
        with pytest.raises(CheckpointError, match=match) as err:
            read(path)
        assert "\n" not in str(err.value)


def test_truncated_shard(w12_dir):
    shard = shard_of(w12_dir)
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    assert_one_line_error(w12_dir, "truncated")


@pytest.mark.parametrize("where", [0, 1, -1])  # first, second and last data byte
def test_flipped_data_byte_fails_its_checksum(w12_dir, where):
    shard = shard_of(w12_dir)
    data = bytearray(shard.read_bytes())
    i = {0: data_start(shard), 1: data_start(shard) + 1, -1: len(data) - 1}[where]
    data[i] ^= 0x01
    shard.write_bytes(bytes(data))
    assert_one_line_error(w12_dir, "CRC-32")
    with pytest.raises(CheckpointError):
        verify_checkpoint(w12_dir.parent / "src", w12_dir)


def test_altered_shard_header(w12_dir):
    shard = shard_of(w12_dir)
    data = bytearray(shard.read_bytes())
    data[9] ^= 0x20  # inside the JSON header
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        read_w12_tensors(w12_dir)


def test_manifest_damage(w12_dir):
    manifest = w12_dir / MANIFEST
    good = manifest.read_text()
    manifest.write_text(good[: len(good) // 2])
    assert_one_line_error(w12_dir, "not valid JSON")
    data = json.loads(good)
    data["version"] = 3
    manifest.write_text(json.dumps(data))
    assert_one_line_error(w12_dir, "version 3 is not supported")
    data = json.loads(good)
    name = next(iter(data["tensors"]))
    for plane in ("lo", "hi"):
        data = json.loads(good)
        data["tensors"][name]["crc32"][plane] ^= 1
        manifest.write_text(json.dumps(data))
        assert_one_line_error(w12_dir, f"{name}.{plane} fails its CRC-32")
    data = json.loads(good)
    del data["tensors"][name]["crc32"]["esc_val"]
    manifest.write_text(json.dumps(data))
    assert_one_line_error(w12_dir, "malformed")


VERSION_1 = ("W12 format version 1, but this SpecPilot reads version 2; "
             "convert the BF16 checkpoint again with `specpilot w12 convert`")


def test_version_1_manifest_asks_for_a_new_conversion(w12_dir):
    manifest = w12_dir / MANIFEST
    data = json.loads(manifest.read_text())
    data["version"] = 1
    manifest.write_text(json.dumps(data))
    assert_one_line_error(w12_dir, f"{MANIFEST}: {VERSION_1}")
    with pytest.raises(CheckpointError, match=VERSION_1):
        verify_checkpoint(w12_dir.parent / "src", w12_dir)


def test_version_1_shard_asks_for_a_new_conversion(w12_dir):
    shard = shard_of(w12_dir)
    data = shard.read_bytes()
    header = b'"version":"2"'
    assert data.count(header) == 1
    shard.write_bytes(data.replace(header, b'"version":"1"'))  # same length: sizes and CRCs still match
    assert_one_line_error(w12_dir, f"{shard.name}: {VERSION_1}")


def test_missing_shard(w12_dir):
    shard_of(w12_dir).unlink()
    with pytest.raises(CheckpointError, match="missing"):
        read_w12_tensors(w12_dir)


def test_manifest_records_format_version_and_checksums(w12_dir):
    manifest = read_manifest(w12_dir)
    assert manifest["format"] == "specpilot-w12" and manifest["version"] == 2
    entry = next(iter(manifest["tensors"].values()))
    assert set(entry["crc32"]) == {"lo", "hi", "base", "esc_ptr", "esc_col", "esc_val"}
    assert shard_metadata(shard_of(w12_dir)) == {"format": "specpilot-w12", "version": "2"}
    assert all(f["bytes"] == (w12_dir / name).stat().st_size for name, f in manifest["files"].items())


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask-022", "umask-027"])
def test_converted_files_get_the_mode_of_the_users_umask(tmp_path, umask):
    """Issue 56: `w12 convert` wrote its shards and kept file 0600 (safetensors' private temporary
    file); every file it writes gets 0o666 & ~umask, as any new file of the user's."""
    src = write_random_checkpoint(tmp_path / "src", tiny_config(num_layers=1), seed=5, dtype=torch.bfloat16)
    before = os.umask(umask)
    try:
        convert_checkpoint(src, tmp_path / "w12", shard_bytes=1 << 16)  # several shards
    finally:
        os.umask(before)
    written = [*sorted((tmp_path / "w12").glob("w12-*.safetensors")), tmp_path / "w12" / "model.safetensors",
               tmp_path / "w12" / MANIFEST]
    assert len(written) > 3
    assert {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in written} == {f.name: oct(0o666 & ~umask)
                                                                             for f in written}
