"""Pack/unpack round trip of the fixture parts, with corruption detected."""

import json

import fixture_pack
import pytest


def make_fixture(root):
    (root / "target").mkdir(parents=True)
    (root / "target" / "model.safetensors").write_bytes(bytes(range(256)) * 300)
    (root / "target" / "config.json").write_text("{}")
    (root / "training_log.json").write_text(json.dumps({"status": "ok"}))
    return root


def test_round_trip(tmp_path, monkeypatch):
    monkeypatch.setattr(fixture_pack, "PART_BYTES", 10_000)  # force several parts
    src = make_fixture(tmp_path / "fixture")
    written = fixture_pack.pack(src, tmp_path / "out")
    parts = [p for p in written if p.name.startswith(fixture_pack.PART_PREFIX)]
    assert len(parts) > 3 and all(p.stat().st_size <= 10_000 for p in parts)
    sizes = fixture_pack.unpack(tmp_path / "out", tmp_path / "dest")
    for rel in sizes:
        assert (tmp_path / "dest" / rel).read_bytes() == (src / rel).read_bytes()
    # deterministic: packing again gives identical parts
    again = fixture_pack.pack(src, tmp_path / "out2")
    assert [p.read_bytes() for p in again[:-1]] == [p.read_bytes() for p in written[:-1]]


def test_corrupt_part_is_refused(tmp_path):
    src = make_fixture(tmp_path / "fixture")
    written = fixture_pack.pack(src, tmp_path / "out")
    part = written[0]
    data = bytearray(part.read_bytes())
    data[100] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match="corrupt"):
        fixture_pack.unpack(tmp_path / "out", tmp_path / "dest")
    assert not (tmp_path / "dest" / "target").exists()
