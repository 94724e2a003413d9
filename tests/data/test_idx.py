"""IDX reader and mnist(): files written here by hand, gzipped and not. No network."""
import gzip
import struct

import numpy as np
import pytest

from minidl.data import load_idx, mnist

# type byte -> (struct format letter for one big-endian value, numpy dtype expected back)
TYPES = {
    0x08: ("B", np.uint8),
    0x09: ("b", np.int8),
    0x0B: ("h", np.int16),
    0x0C: ("i", np.int32),
    0x0D: ("f", np.float32),
    0x0E: ("d", np.float64),
}


def idx_bytes(values, shape, type_byte):
    """An IDX file built with struct, independently of the reader."""
    letter = TYPES[type_byte][0]
    header = bytes([0, 0, type_byte, len(shape)]) + struct.pack(f">{len(shape)}I", *shape)
    return header + struct.pack(f">{len(values)}{letter}", *values)


def write(path, data, gz=False):
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("type_byte, values", [
    (0x08, [0, 1, 127, 128, 200, 255]),
    (0x09, [-128, -1, 0, 1, 100, 127]),
    (0x0B, [-32768, -300, 0, 1, 258, 32767]),
    (0x0C, [-2**31, -70000, 0, 1, 65536 + 3, 2**31 - 1]),
    (0x0D, [-1.5, 0.0, 0.25, 3.0, 1e10, -2.5e-3]),
    (0x0E, [-1.5, 0.0, 0.1, 3.0, 1e300, -2.5e-300]),
])
def test_every_idx_type_reads_back_its_values(tmp_path, type_byte, values, gz):
    path = write(tmp_path / ("a.idx.gz" if gz else "a.idx"), idx_bytes(values, (2, 3), type_byte), gz)
    array = load_idx(path)
    expected_dtype = np.dtype(TYPES[type_byte][1])
    assert array.shape == (2, 3)
    assert array.dtype == expected_dtype and array.dtype.isnative
    np.testing.assert_array_equal(array, np.array(values, dtype=expected_dtype).reshape(2, 3))
    assert array.flags.writeable


def test_gzip_is_detected_by_content_not_name(tmp_path):
    data = idx_bytes(list(range(24)), (2, 3, 4), 0x08)
    from_plain_named_gz = load_idx(write(tmp_path / "x.gz", data, gz=False))
    from_gz_without_suffix = load_idx(write(tmp_path / "x", data, gz=True))
    np.testing.assert_array_equal(from_plain_named_gz, np.arange(24).reshape(2, 3, 4))
    np.testing.assert_array_equal(from_gz_without_suffix, from_plain_named_gz)


def test_one_dimensional_and_empty(tmp_path):
    np.testing.assert_array_equal(load_idx(write(tmp_path / "l", idx_bytes([7, 3], (2,), 0x08))), [7, 3])
    assert load_idx(write(tmp_path / "e", idx_bytes([], (0, 28, 28), 0x08))).shape == (0, 28, 28)


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_data_is_reported(tmp_path, gz):
    data = idx_bytes(list(range(60)), (3, 4, 5), 0x08)[:-7]
    expected = r"truncated: shape \(3, 4, 5\) of uint8 needs 60 data bytes, the file has 53"
    with pytest.raises(ValueError, match=expected):
        load_idx(write(tmp_path / "t", data, gz))


def test_truncated_header_and_tiny_files(tmp_path):
    data = idx_bytes(list(range(6)), (2, 3), 0x08)
    with pytest.raises(ValueError, match="announces 2 dimensions"):
        load_idx(write(tmp_path / "h", data[:9]))
    with pytest.raises(ValueError, match="too short"):
        load_idx(write(tmp_path / "s", b"\x00\x00"))


def test_foreign_and_damaged_files(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + bytes(40)
    with pytest.raises(ValueError, match="not an IDX file: its magic number is 89 50 4e 47"):
        load_idx(write(tmp_path / "picture.png", png))
    with pytest.raises(ValueError, match="not an IDX file"):
        load_idx(write(tmp_path / "badtype", bytes([0, 0, 0x0A, 1, 0, 0, 0, 1, 5])))
    with pytest.raises(ValueError, match="bytes after the data"):
        load_idx(write(tmp_path / "long", idx_bytes([1, 2], (2,), 0x08) + b"\x00"))
    cut_gzip = gzip.compress(idx_bytes(list(range(200)), (200,), 0x0B))[:-12]
    with pytest.raises(ValueError, match="cannot be decompressed"):
        load_idx(write(tmp_path / "cut.gz", cut_gzip))
    with pytest.raises(FileNotFoundError, match="no file at"):
        load_idx(tmp_path / "absent")


def write_mnist(root, prefix, n, gz, dotted=False, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28))
    labels = rng.integers(0, 10, size=n)
    sep = "." if dotted else "-"
    suffix = ".gz" if gz else ""
    image_bytes = idx_bytes(images.ravel().tolist(), (n, 28, 28), 0x08)
    write(root / f"{prefix}-images{sep}idx3-ubyte{suffix}", image_bytes, gz)
    write(root / f"{prefix}-labels{sep}idx1-ubyte{suffix}", idx_bytes(labels.tolist(), (n,), 0x08), gz)
    return images, labels


def test_mnist_reads_train_and_test_files(tmp_path):
    train_images, train_labels = write_mnist(tmp_path, "train", 5, gz=True)
    test_images, test_labels = write_mnist(tmp_path, "t10k", 3, gz=False, seed=1)
    x, y = mnist(tmp_path)
    assert x.shape == (5, 28, 28) and x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(x, train_images)
    np.testing.assert_array_equal(y, train_labels)
    x, y = mnist(str(tmp_path), train=False)
    np.testing.assert_array_equal(x, test_images)
    np.testing.assert_array_equal(y, test_labels)


def test_mnist_accepts_the_dotted_file_names(tmp_path):
    images, labels = write_mnist(tmp_path, "train", 2, gz=False, dotted=True)
    np.testing.assert_array_equal(mnist(tmp_path)[1], labels)


def test_missing_mnist_files_are_listed_with_their_place(tmp_path):
    write_mnist(tmp_path, "train", 2, gz=True)
    (tmp_path / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError) as info:
        mnist(tmp_path)
    message = str(info.value)
    assert str(tmp_path / "train-labels-idx1-ubyte") + ".gz" in message
    assert "train-images" not in message  # only what is missing
    with pytest.raises(FileNotFoundError) as info:
        mnist(tmp_path / "nowhere", train=False)
    message = str(info.value)
    assert "does not exist" in message
    assert "t10k-images-idx3-ubyte" in message and "t10k-labels-idx1-ubyte" in message
    assert "never downloads" in message


def test_mismatched_mnist_files(tmp_path):
    write_mnist(tmp_path, "train", 4, gz=False)
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes([1, 2, 3], (3,), 0x08))
    with pytest.raises(ValueError, match="do not belong together"):
        mnist(tmp_path)
