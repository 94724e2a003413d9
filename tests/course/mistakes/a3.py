"""Assignment 3 (the backward walk): wrong solutions as students write them."""
from tests.course.mistakes import Mistake

ORDER = "minidl.autograd.walk.topological_order"
PENDING, LEAF = "minidl.autograd.walk._add_pending", "minidl.autograd.walk._accumulate_leaf"
TANH_GRAD = "minidl.ops.activation.TanhGrad.backward"

_PENDING = """
creator = out.creator
entry = pending.get(creator)
if entry is None:
    slots = [None] * len(creator.outputs)
    slots[out.output_index] = g
    pending[creator] = (slots, [out])
    return
slots = entry[0]
old = slots[out.output_index]
if old is None:
    slots[out.output_index] = g
    entry[1].append(out)
else:
    {add}
"""

MISTAKES = [
    Mistake("3.1", "a recursive depth-first search: a long chain passes Python's recursion limit", {ORDER: """
order, seen = [], set()

def visit(fn):
    if fn in seen:
        return
    seen.add(fn)
    for x in fn.inputs:
        if x.creator is not None:
            visit(x.creator)
    order.append(fn)
for fn in roots:
    visit(fn)
order.reverse()
return order
"""}, (), public_passes=True),
    Mistake("3.1", "no record of the nodes seen", {ORDER: """
order = []
stack = [(fn, False) for fn in roots]
while stack:
    fn, children_done = stack.pop()
    if children_done:
        order.append(fn)
        continue
    stack.append((fn, True))
    stack.extend((x.creator, False) for x in fn.inputs if x.creator is not None)
order.reverse()
return order
"""}, ("node visited twice",)),
    Mistake("3.1", "the order not reversed: leaves first", {ORDER: """
order, seen = [], set()
stack = [(fn, False) for fn in roots]
while stack:
    fn, children_done = stack.pop()
    if children_done:
        order.append(fn)
        continue
    if fn in seen:
        continue
    seen.add(fn)
    stack.append((fn, True))
    stack.extend((x.creator, False) for x in fn.inputs if x.creator is not None and x.creator not in seen)
return order
"""}, ("order not topological",)),
    Mistake("3.1", "breadth-first from the output", {ORDER: """
order, seen = [], set()
queue = list(roots)
while queue:
    fn = queue.pop(0)
    if fn in seen:
        continue
    seen.add(fn)
    order.append(fn)
    queue.extend(x.creator for x in fn.inputs if x.creator is not None)
return order
"""}, ("order not topological",)),
    Mistake("3.2", "a second use replaces the first's gradient", {PENDING: _PENDING.format(
        add="slots[out.output_index] = g")}, ("gradient overwritten, not accumulated",)),
    Mistake("3.2", "a second use added in place into the first's gradient", {PENDING: _PENDING.format(
        add="old += g")}, ("in-place write into a saved input",)),
    Mistake("3.2", "a leaf's gradient replaced by each use", {LEAF: "x._grad, x._grad_owned = g, False\n"},
            ("gradient overwritten, not accumulated",)),
    Mistake("3.2", "a leaf's gradient added in place even when its array is shared", {LEAF: """
if x._grad is None:
    x._grad, x._grad_owned = g, False
else:
    x._grad._data += g._data
"""}, ("in-place write into a saved input",)),
    Mistake("3.3", "the derivative of y² without its 2", {TANH_GRAD: """
y, gy = self.inputs
return -gz * gy * y, gz * (1 - y * y)
"""}, ("factor of 2",)),
    Mistake("3.3", "the second derivative's sign lost", {TANH_GRAD: """
y, gy = self.inputs
return 2 * gz * gy * y, gz * (1 - y * y)
"""}, ("sign",)),
    Mistake("3.3", "no gradient for the incoming gradient", {TANH_GRAD: """
y, gy = self.inputs
return -2 * gz * gy * y, None
"""}, ("missing term",)),
]
