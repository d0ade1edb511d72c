"""Arrays stored by digest: each codec round-trips every bit, the choice per array, and a
damaged, cut, inflated or hostile stored array is a CorruptRowError, never a bomb."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import zstandard
from PIL import Image

from expstore.codec.compression import (
    ARRAY_HEADER,
    check_compression,
    pack_array,
    stored_codec,
    unpack_array,
)
from expstore.codec.digests import array_digest
from expstore.codec.format import crc32
from expstore.errors import CorruptRowError, InvalidArgumentError

RNG = np.random.default_rng(0)


def page(height: int = 120, width: int = 160, channels: int = 3) -> np.ndarray:
    """Page-like content: flat regions and some texture."""
    image = np.full((height, width, channels), 255, np.uint8)
    image[10:30, 10:150] = RNG.integers(0, 255, (20, 140, channels), dtype=np.uint8)
    image[50:52] = 0
    return image


def photo(size: int = 128) -> np.ndarray:
    """Photo-like content: smooth, noisy (PNG's filters beat zstd here)."""
    walk = np.cumsum(RNG.integers(-3, 4, (size, size, 3)), axis=1)
    return ((walk - walk.min()) % 256).astype(np.uint8)


def round_trip(array: np.ndarray, compression: str | None) -> tuple[np.ndarray, str]:
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    digest = array_digest(data)
    stored = pack_array(data, digest, compression)
    back = unpack_array(stored, digest, data.dtype, data.shape, "row r: state.obs")
    assert back.flags.writeable
    return back, stored_codec(stored)


ARRAYS = {
    "page": page(),
    "gray": page()[:, :, 0].copy(),
    "rgba": page(channels=4),
    "float32": RNG.normal(size=(64, 257)).astype(np.float32),
    "float64 nan -0.0": np.array([np.nan, -0.0, 1e308, 5e-324] * 50, np.float64),
    "int64": np.arange(5000, dtype=np.int64) * 3,
    "bool": RNG.random((100, 100)) > 0.5,
    "complex": (RNG.normal(size=300) + 1j).astype(np.complex64),
    "empty": np.zeros((0, 3), np.float32),
}


@pytest.mark.parametrize("compression", ["auto", "zstd", "png", "webp", None])
@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_every_codec_brings_back_every_bit(name: str, compression: str | None) -> None:
    array = ARRAYS[name]
    back, _ = round_trip(array, compression)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == array.tobytes()


def test_zstd_compresses_pages_and_auto_keeps_them_in_zstd() -> None:
    array = page(720, 1280)
    digest = array_digest(array)
    stored = pack_array(array, digest, "auto")
    assert stored_codec(stored) == "zstd"
    assert len(stored) < array.nbytes * 0.2


def test_auto_takes_png_for_photo_like_images_where_it_is_much_smaller() -> None:
    array = photo()
    digest = array_digest(array)
    zstd_size = len(pack_array(array, digest, "zstd"))
    stored = pack_array(array, digest, "auto")
    assert stored_codec(stored) == "png"
    assert len(stored) * 4 <= zstd_size * 3


def test_an_image_codec_falls_back_to_zstd_for_what_it_cannot_hold() -> None:
    """Float images, two channels, more than WebP's 16383 pixels: silently, losslessly."""
    for array, compression in [
        (RNG.random((64, 64, 3)).astype(np.float32), "png"),
        (page(channels=2), "png"),
        (np.zeros((2, 16384), np.uint8), "webp"),
        (np.arange(70000, dtype=np.uint8), "png"),  # 1-D
    ]:
        back, codec = round_trip(array, compression)
        assert codec in ("zstd", "zstd+shuffle", "raw")
        assert back.tobytes() == array.tobytes()


def test_byte_shuffle_is_taken_where_it_is_smaller() -> None:
    smooth = np.linspace(0, 1, 100_000, dtype=np.float32)
    assert round_trip(smooth, "zstd")[1] == "zstd+shuffle"
    assert round_trip(page(), "zstd")[1] == "zstd"  # one-byte dtypes are never shuffled


def test_incompressible_arrays_are_stored_raw() -> None:
    noise = RNG.integers(0, 255, 100_000, dtype=np.uint8)
    back, codec = round_trip(noise, "auto")
    assert codec == "raw" and np.array_equal(back, noise)


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="compression must be one of 'auto'"):
        check_compression("lz4")
    with pytest.raises(InvalidArgumentError, match="compression must be one of"):
        check_compression(True)


# -- damaged and hostile stored arrays ------------------------------------------------------


def resealed(stored: bytes, digest: str, codec: int, stream: bytes) -> bytes:
    """Stored bytes with another codec and stream and a valid checksum: what a hostile
    writer could put in the table."""
    head = bytes([codec]) + bytes(7)
    crc = crc32(stream, crc32(head, crc32(digest.encode())))
    return stored[:4] + struct.pack("<I", crc) + head + stream


def unpack(stored: bytes, array: np.ndarray, digest: str | None = None) -> np.ndarray:
    return unpack_array(
        stored, digest or array_digest(array), array.dtype, array.shape, "row r: state.obs"
    )


def test_a_cut_or_flipped_stored_array_is_corrupt() -> None:
    array = page()
    stored = pack_array(array, array_digest(array), "zstd")
    with pytest.raises(CorruptRowError, match=r"row r: state\.obs: the stored array .* checksum"):
        unpack(stored[:-10], array)
    flipped = bytearray(stored)
    flipped[-5] ^= 0xFF
    with pytest.raises(CorruptRowError, match="checksum"):
        unpack(bytes(flipped), array)
    with pytest.raises(CorruptRowError, match="header"):
        unpack(b"XSA", array)
    with pytest.raises(CorruptRowError, match="checksum"):  # another digest's bytes
        unpack(stored, array, "0" * 32)


def test_a_zstd_frame_that_declares_more_than_the_shape_is_refused_before_decoding() -> None:
    array = page()
    digest = array_digest(array)
    stored = pack_array(array, digest, "zstd")
    bomb = zstandard.ZstdCompressor().compress(bytes(array.nbytes * 100))
    with pytest.raises(CorruptRowError, match=f"declares {array.nbytes * 100} bytes"):
        unpack(resealed(stored, digest, 1, bomb), array)
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(10**7))
    with pytest.raises(CorruptRowError, match="declares -1 bytes"):
        unpack(resealed(stored, digest, 1, unsized), array)
    cut = zstandard.ZstdCompressor().compress(array.tobytes())[:-20]
    with pytest.raises(CorruptRowError, match="cannot be decoded"):
        unpack(resealed(stored, digest, 1, cut), array)
    with pytest.raises(CorruptRowError, match="holds 5 bytes"):
        unpack(resealed(stored, digest, 0, b"12345"), array)
    with pytest.raises(CorruptRowError, match="codec 9"):
        unpack(resealed(stored, digest, 9, b""), array)


def test_an_image_of_another_size_than_its_shape_is_refused_before_decoding() -> None:
    array = page()
    digest = array_digest(array)
    stored = pack_array(array, digest, "png")
    big = io.BytesIO()
    Image.new("RGB", (4000, 4000)).save(big, "PNG")
    with pytest.raises(CorruptRowError, match="RGB image of 4000x4000, not the RGB 160x120"):
        unpack(resealed(stored, digest, 3, big.getvalue()), array)
    png = stored[ARRAY_HEADER:]
    with pytest.raises(CorruptRowError, match="cannot be decoded"):
        unpack(resealed(stored, digest, 3, png[: len(png) // 2]), array)
    with pytest.raises(CorruptRowError, match="placeholder says float32"):
        unpack_array(stored, digest, np.dtype("<f4"), (120, 160, 3), "row r")


def test_reading_an_image_without_pillow_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from expstore.errors import MissingDependencyError

    array = page()
    digest = array_digest(array)
    stored = pack_array(array, digest, "png")
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(MissingDependencyError, match=r"expstore\[images\]"):
        unpack(stored, array)
