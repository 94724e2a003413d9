"""Assignment 7 (a ring all-reduce): wrong solutions as students write them."""
from tests.course.mistakes import Mistake

SCATTER, GATHER = "minidl.course.ring.ring_reduce_scatter_", "minidl.course.ring.ring_allgather_"
ALLREDUCE, AVERAGE = "minidl.course.ring.ring_allreduce_", "minidl.course.ring.average_gradients_"

_SCATTER = """
n, r = comm.size, comm.rank
bounds = chunk_bounds(array.size, n)
right, left = (r + 1) % n, (r - 1) % n
for s in range({steps}):
    a, b = bounds[(r - s) % n]
    c, d = bounds[(r - s - {shift}) % n]
    incoming = np.empty(d - c, array.dtype)
    comm.sendrecv_(array[a:b].copy(), right, incoming, left)
    array[c:d] {op} incoming
return (r + 1) % n
"""

_GATHER = """
n, r = comm.size, comm.rank
bounds = chunk_bounds(array.size, n)
right, left = (r + 1) % n, (r - 1) % n
for s in range({steps}):
    a, b = bounds[({send}) % n]
    c, d = bounds[(owned - s - 1) % n]
    incoming = np.empty(d - c, array.dtype)
    comm.sendrecv_(array[a:b].copy(), right, incoming, left)
    array[c:d] {op} incoming
"""

MISTAKES = [
    Mistake("7.1", "N steps instead of N − 1", {SCATTER: _SCATTER.format(steps="n", shift=1, op="+=")},
            ("steps off by one",)),
    Mistake("7.1", "the received chunk added into the one just sent", {SCATTER: _SCATTER.format(
        steps="n - 1", shift=0, op="+=")}, ("chunks misrouted",)),
    Mistake("7.1", "the received chunk stored, not added", {SCATTER: _SCATTER.format(steps="n - 1", shift=1, op="=")},
            ("gradient overwritten, not accumulated",)),
    Mistake("7.2", "N − 2 steps", {GATHER: _GATHER.format(steps="n - 2", send="owned - s", op="=")},
            ("steps off by one",)),
    Mistake("7.2", "every step sends the rank's own chunk again", {GATHER: _GATHER.format(
        steps="n - 1", send="owned", op="=")}, ("chunks misrouted",)),
    Mistake("7.2", "the received chunk added to the stale one", {GATHER: _GATHER.format(
        steps="n - 1", send="owned - s", op="+=")}, ("added, not copied",)),
    Mistake("7.3", "the gradients summed but not divided", {AVERAGE: """
for p in parameters:
    if p.grad is not None:
        g = np.array(p.grad.data)
        ring_allreduce_(comm, g)
        p.grad = g
"""}, ("not averaged",)),
    Mistake("7.3", "every rank sends its whole array to every other", {ALLREDUCE: """
if comm.size == 1:
    return array
flat = array.reshape(-1)
total = flat.copy()
incoming = np.empty_like(flat)
for k in range(1, comm.size):
    comm.sendrecv_(flat.copy(), (comm.rank + k) % comm.size, incoming, (comm.rank - k) % comm.size)
    total += incoming
flat[...] = total
return array
"""}, ("not a ring",), public_passes=False),
    Mistake("7.3", "the ring run on the array as it is shaped", {ALLREDUCE: """
if comm.size == 1:
    return array
owned = ring_reduce_scatter_(comm, array)
ring_allgather_(comm, array, owned)
return array
"""}, ()),
]
