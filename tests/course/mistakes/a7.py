"""Assignment 7 (a ring all-reduce): wrong solutions as students write them."""
from tests.course.mistakes import Mistake

ALLREDUCE, AVERAGE = "minidl.parallel.ring.ring_allreduce_", "minidl.course.data_parallel.average_gradients_"

_RING = """
n, r = comm.size, comm.rank
if n == 1:
    return array
flat = array.reshape(-1)
chunks = [flat[start:stop] for start, stop in chunk_bounds(flat.size, n)]
right, left = (r + 1) % n, (r - 1) % n
incoming = xp_of(array).empty(chunks[0].size, array.dtype)
for s in range({scatter_steps}):
    send, receive = chunks[(r - s) % n], chunks[(r - s - {shift}) % n]
    got = comm.sendrecv_(send, right, incoming[:receive.size], left)
    receive {scatter_op} got
for s in range({gather_steps}):
    send, receive = chunks[({gather_send}) % n], chunks[(r - s) % n]
    {gather}
return array
"""


def _ring(scatter_steps="n - 1", shift=1, scatter_op="+=", gather_steps="n - 1", gather_send="r + 1 - s",
          gather="comm.sendrecv_(send, right, receive, left)"):
    return _RING.format(scatter_steps=scatter_steps, shift=shift, scatter_op=scatter_op, gather_steps=gather_steps,
                        gather_send=gather_send, gather=gather)


MISTAKES = [
    Mistake("7.1", "N − 2 steps of reduce-scatter", {ALLREDUCE: _ring(scatter_steps="n - 2")},
            ("steps off by one",)),
    Mistake("7.1", "the received chunk added into the one just sent", {ALLREDUCE: _ring(shift=0)},
            ("chunks misrouted",)),
    Mistake("7.1", "the reduce-scatter stores the received chunk instead of adding it", {ALLREDUCE: _ring(
        scatter_op="[...] =")}, ("gradient overwritten, not accumulated",)),
    Mistake("7.1", "the all-gather sends the rank's own chunk at every step", {ALLREDUCE: _ring(gather_send="r + 1")},
            ("chunks misrouted",)),
    Mistake("7.1", "the all-gather adds the received chunk to the stale one", {ALLREDUCE: _ring(
        gather="receive += comm.sendrecv_(send, right, incoming[:receive.size], left)")}, ("added, not copied",)),
    Mistake("7.2", "the gradients summed but not divided", {AVERAGE: """
for p in parameters:
    if p.grad is not None:
        g = np.array(p.grad.array)
        ring_allreduce_(comm, g)
        p.grad = g
"""}, ("not averaged",)),
    Mistake("7.2", "divided by N before the sum and again after", {AVERAGE: """
for p in parameters:
    if p.grad is not None:
        g = np.array(p.grad.array) / comm.size
        ring_allreduce_(comm, g)
        p.grad = g / comm.size
"""}, ("missing scale",)),
    Mistake("7.2", "the average computed and never written back", {AVERAGE: """
for p in parameters:
    if p.grad is not None:
        g = np.array(p.grad.array)
        ring_allreduce_(comm, g)
        g /= comm.size
"""}, ()),
]
