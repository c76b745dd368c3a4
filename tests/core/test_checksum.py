"""Checkpoint checksums: XXH3-128 named in the record, and the bare sha256 that run
directories written by earlier releases hold, still verified as sha256."""

from __future__ import annotations

import hashlib

import pytest
import xxhash

from kiln.core.checkpoints.checksum import algorithm_of, checksum_of, matches


@pytest.fixture
def shard(tmp_path):
    """A sharded checkpoint's directory: two files, one in a subdirectory."""
    shard = tmp_path / "step-2.ckpt"
    (shard / "sub").mkdir(parents=True)
    (shard / "meta.pt").write_bytes(b"m")
    (shard / "sub" / "0.distcp").write_bytes(b"s0")
    return shard


def test_a_file_is_recorded_as_xxh3_128_of_its_bytes(tmp_path):
    path = tmp_path / "one.ckpt"
    path.write_bytes(b"weights" * 300_000)  # several read blocks
    expected = xxhash.xxh3_128(b"weights" * 300_000).hexdigest()
    assert checksum_of(path) == f"xxh3_128:{expected}"
    assert matches(path, checksum_of(path))
    path.write_bytes(b"weightz" * 300_000)
    assert not matches(path, f"xxh3_128:{expected}")


def test_a_directory_is_one_checksum_over_each_files_path_and_bytes_in_path_order(shard):
    expected = xxhash.xxh3_128(b"meta.pt\0m" + b"sub/0.distcp\0s0").hexdigest()
    assert checksum_of(shard) == f"xxh3_128:{expected}"
    (shard / "sub" / "0.distcp").write_bytes(b"s1")
    assert checksum_of(shard) != f"xxh3_128:{expected}"


def test_a_bare_hex_digest_is_an_earlier_releases_sha256_and_still_verifies(tmp_path, shard):
    path = tmp_path / "one.ckpt"
    path.write_bytes(b"weights")
    legacy = hashlib.sha256(b"weights").hexdigest()  # what run.json held before XXH3
    assert algorithm_of(legacy) == "sha256"
    assert checksum_of(path, "sha256") == legacy
    assert matches(path, legacy)
    path.write_bytes(b"weightz")
    assert not matches(path, legacy)
    # a sharded directory's legacy digest: the same walk over paths and bytes
    assert matches(shard, hashlib.sha256(b"meta.pt\0m" + b"sub/0.distcp\0s0").hexdigest())


def test_an_unknown_algorithm_is_named_with_the_ones_kiln_knows(tmp_path):
    path = tmp_path / "one.ckpt"
    path.write_bytes(b"weights")
    with pytest.raises(ValueError, match=r"'md5'.*xxh3_128, sha256"):
        matches(path, "md5:0123")
