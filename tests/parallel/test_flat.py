"""minidl.parallel.flat: ranges of several arrays seen as one flat vector, against np.concatenate."""
import numpy as np
import pytest

from minidl.parallel import flat


def _arrays():
    rng = np.random.default_rng(0)
    return [rng.normal(size=(3, 4)), rng.normal(size=5), rng.normal(size=(2, 2))]


@pytest.mark.parametrize("start, stop", [(0, 21), (0, 24), (2, 9), (12, 17), (15, 24), (21, 24), (11, 12)])
def test_read_range_is_a_slice_of_the_concatenation_with_zero_padding(start, stop):
    arrays = _arrays()
    whole = np.concatenate([a.reshape(-1) for a in arrays] + [np.zeros(3)])   # 21 elements, padded to 24
    out = np.full(stop - start, np.nan)
    flat.read_range(arrays, [a.size for a in arrays], start, out)
    np.testing.assert_array_equal(out, whole[start:stop])
    flat.read_range(arrays, [a.size for a in arrays], start, out, weight=0.5)
    np.testing.assert_array_equal(out, 0.5 * whole[start:stop])


def test_read_range_reads_a_missing_array_as_zeros():
    arrays = _arrays()
    out = flat.read_range([arrays[0], None, arrays[2]], [12, 5, 4], 10, np.full(11, np.nan))
    np.testing.assert_array_equal(out, np.concatenate([arrays[0].reshape(-1)[10:], np.zeros(5), arrays[2].reshape(-1)]))


@pytest.mark.parametrize("contiguous", [True, False])
def test_write_range_puts_each_element_into_its_array_and_drops_the_padding(contiguous):
    arrays = _arrays()
    if not contiguous:
        arrays[0] = np.asfortranarray(arrays[0])
    before = [a.copy() for a in arrays]
    values = np.arange(100.0, 112.0)                 # elements 10..22 of 24: into the 3 arrays, 2 of padding
    flat.write_range(arrays, [a.size for a in arrays], 10, values)
    whole = np.concatenate([a.reshape(-1) for a in before] + [np.zeros(3)])
    whole[10:22] = values
    np.testing.assert_array_equal(np.concatenate([a.reshape(-1) for a in arrays]), whole[:21])


def test_pieces_cover_the_length_in_runs_that_fit_the_bytes():
    assert flat.pieces(10, 8, 32, ranks=2) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]  # 2 ranks × 2 × 8 B
    assert flat.pieces(10, 8, 2**20) == [(0, 10)]
    assert flat.pieces(3, 8, 1, ranks=4) == [(0, 1), (1, 2), (2, 3)]                      # at least one element
    assert flat.pieces(0, 8, 64) == []
