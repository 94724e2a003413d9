"""Assignment 6 (gradient checkpointing): wrong solutions as students write them."""
from tests.course.mistakes import Mistake

UNIFORM, SQRT = "minidl.checkpoint.segments.uniform_boundaries", "minidl.checkpoint.plan.sqrt_segments"
PEAK, SLOWDOWN = "minidl.checkpoint.plan.SegmentPlan.peak_bytes", "minidl.checkpoint.plan.SegmentPlan.slowdown"
SEQUENTIAL = "minidl.checkpoint.segments.checkpoint_sequential"

_SEQUENTIAL = """
layers = layer_list(functions, "checkpoint_sequential")
starts = _segment_starts(segments, len(layers))
dtype = resolve_storage_dtype(storage_dtype, input.xp)
x = input
{body}"""

MISTAKES = [
    Mistake("6.1", "segments of ⌈L/k⌉ layers", {UNIFORM: """
size = -(-num_layers // segments)
return [i * size for i in range(segments)]
"""}, ("segments misplaced",)),
    Mistake("6.1", "√L rounded down", {SQRT: "return max(1, min(num_layers, int(math.sqrt(num_layers))))\n"},
            ("rounded down",)),
    Mistake("6.1", "segments spread evenly instead of PyTorch's rule", {UNIFORM: """
return [round(i * num_layers / segments) for i in range(segments)]
"""}, ()),
    Mistake("6.2", "the peak without the inputs kept for the earlier segments", {PEAK: """
starts = list(self.boundaries if boundaries is None else boundaries)
return int(max(self.segment_bytes(starts)))
"""}, ("missing term",)),
    Mistake("6.2", "a segment's own input counted while it is recomputed", {PEAK: """
starts = list(self.boundaries if boundaries is None else boundaries)
held, peak = 0, 0
for start, seg in zip(starts, self.segment_bytes(starts)):
    held += self.input_bytes[start]
    peak = max(peak, held + seg)
return int(peak)
"""}, ("segments misplaced",)),
    Mistake("6.2", "every layer's forward counted as recomputed", {SLOWDOWN: """
step = sum(self.forward_seconds) + sum(self.backward_seconds)
return 1.0 + sum(self.forward_seconds) / step if step > 0 else 1.0
"""}, ("last segment checkpointed",)),
    Mistake("6.3", "the last segment checkpointed too", {SEQUENTIAL: _SEQUENTIAL.format(body="""
for a, b in zip(starts, starts[1:] + [len(layers)]):
    x = _checkpoint(_run(layers[a:b]), (x,), preserve_rng_state, dtype)
return x
""")}, ("last segment checkpointed",)),
    Mistake("6.3", "every layer run plainly", {SEQUENTIAL: _SEQUENTIAL.format(body="return _run(layers)(x)\n")},
            ("nothing checkpointed",)),
    Mistake("6.3", "the last segment forgotten", {SEQUENTIAL: _SEQUENTIAL.format(body="""
for a, b in zip(starts, starts[1:]):
    x = _checkpoint(_run(layers[a:b]), (x,), preserve_rng_state, dtype)
return x
""")}, ()),
]
