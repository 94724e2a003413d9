"""Several arrays seen as one flat vector, read and written a range at a time.

ZeRO lays a group of parameters out as one flat vector (their elements one after the
other, zeros padding the end) and cuts it into the ranks' chunks. A collective over the
whole vector at once needs a buffer of the whole vector besides the parameters or
gradients it comes from: at the step's peak, a second copy of the largest unit. Moving it
in *pieces* bounds that buffer instead: each piece is read from the arrays (or written
back into them) where its elements live,

    flat[start:stop] = concat(arrays)[start:stop]        (zeros past the end and for a missing array)

so a collective in pieces hands the communicator the same elements, in the same total
bytes, as one collective of the whole vector, and holds only one piece besides them.
"""
from __future__ import annotations

from minidl.backend import xp_of


def pieces(length: int, itemsize: int, max_bytes: int, ranks: int = 1) -> list[tuple[int, int]]:
    """[start, stop) ranges cutting 0..length into equal runs (the last shorter) such that ``ranks`` runs
    together hold at most ``max_bytes`` (at least one element per run)."""
    if length <= 0:
        return []
    step = max(1, int(max_bytes) // (int(itemsize) * max(1, int(ranks))))
    return [(start, min(start + step, length)) for start in range(0, length, step)]


def read_range(arrays, sizes, start: int, out, weight: float = 1.0):
    """out[...] = weight · concat(arrays)[start:start + len(out)], as flat elements (a missing array, None,
    and the padding past the last array read as zeros); returns ``out``."""
    stop, offset, filled = start + out.size, 0, 0
    for array, size in zip(arrays, sizes):
        lo, hi = max(start, offset), min(stop, offset + size)
        if lo < hi:
            target = out[lo - start:hi - start]
            if lo - start > filled:
                out[filled:lo - start] = 0
            if array is None:
                target[...] = 0
            elif weight == 1.0:
                target[...] = array.reshape(-1)[lo - offset:hi - offset]
            else:
                xp_of(array).multiply(array.reshape(-1)[lo - offset:hi - offset], weight, out=target)
            filled = hi - start
        offset += size
        if offset >= stop:
            break
    if filled < out.size:
        out[filled:] = 0
    return out


def write_range(arrays, sizes, start: int, values) -> None:
    """concat(arrays)[start:start + len(values)] = values, each element into the array it belongs to (elements
    past the last array, the padding, are dropped)."""
    stop, offset = start + values.size, 0
    for array, size in zip(arrays, sizes):
        lo, hi = max(start, offset), min(stop, offset + size)
        if lo < hi:
            flat = array.reshape(-1)  # a view of a contiguous array; of any other, a copy written back below
            flat[lo - offset:hi - offset] = values[lo - start:hi - start]
            if not array.flags.c_contiguous:
                array[...] = flat.reshape(array.shape)
        offset += size
        if offset >= stop:
            break
