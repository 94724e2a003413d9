"""Assignment 5 (initializers and bias rules): wrong solutions as students write them."""
from tests.course.mistakes import Mistake

INIT = "minidl.nn.init"
FANS, GAIN = f"{INIT}._calculate_fan_in_and_fan_out", f"{INIT}.calculate_gain"
XU, XN = f"{INIT}.xavier_uniform_", f"{INIT}.xavier_normal_"
KU, KN = f"{INIT}.kaiming_uniform_", f"{INIT}.kaiming_normal_"
BINARY, PRIORS, REGRESSION = (f"{INIT}.init_bias_imbalanced_binary", f"{INIT}.init_bias_class_priors",
                              f"{INIT}.init_bias_regression")

_GAIN = """
if nonlinearity == "leaky_relu":
    slope = 0.01 if param is None else float(param)
    return {leaky}
{extra}return _GAINS[nonlinearity]
"""

MISTAKES = [
    Mistake("5.1", "fan_in from the output axis", {FANS: """
shape = tuple(tensor.shape)
receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
return shape[0] * receptive, shape[1] * receptive
"""}, ("fan_in and fan_out swapped",)),
    Mistake("5.1", "a convolution's kernel left out of its fans", {FANS: """
shape = tuple(tensor.shape)
return shape[1], shape[0]
"""}, ("receptive field ignored",)),
    Mistake("5.1", "ReLU's gain as 2", {GAIN: _GAIN.format(leaky="math.sqrt(2.0 / (1 + slope ** 2))",
                                                           extra='if nonlinearity == "relu":\n    return 2.0\n')},
            ("variance for standard deviation",)),
    Mistake("5.1", "leaky ReLU's gain without the slope squared", {GAIN: _GAIN.format(
        leaky="math.sqrt(2.0 / (1 + slope))", extra="")}, ("missing term",), public_passes=True),
    Mistake("5.2", "the uniform bound set to σ", {XU: """
fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
k = gain * math.sqrt(2.0 / (fan_in + fan_out))
return uniform_(tensor, -k, k)
"""}, ("uniform bound is σ, not √3·σ",)),
    Mistake("5.2", "Xavier normal from fan_in alone", {XN: """
fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
return normal_(tensor, 0.0, gain * math.sqrt(1.0 / fan_in))
"""}, ("only one fan",)),
    Mistake("5.2", "Xavier normal forgets the gain", {XN: """
fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
return normal_(tensor, 0.0, math.sqrt(2.0 / (fan_in + fan_out)))
"""}, ("missing gain",), public_passes=True),
    Mistake("5.3", "Kaiming normal always from fan_in", {KN: """
std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, "fan_in"))
return normal_(tensor, 0.0, std)
"""}, ("fan_in and fan_out swapped",), public_passes=True),
    Mistake("5.3", "Kaiming uniform with the bound σ", {KU: """
std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
return uniform_(tensor, -std, std)
"""}, ("uniform bound is σ, not √3·σ",)),
    Mistake("5.3", "Kaiming normal with σ = gain²/fan", {KN: """
std = calculate_gain(nonlinearity, a) ** 2 / _fan(tensor, mode)
return normal_(tensor, 0.0, std)
"""}, ("variance for standard deviation",)),
    Mistake("5.3", "Kaiming uniform without the gain", {KU: """
std = 1.0 / math.sqrt(_fan(tensor, mode))
bound = math.sqrt(3.0) * std
return uniform_(tensor, -bound, bound)
"""}, ("missing gain",)),
    Mistake("5.4", "the odds upside down", {BINARY: """
return constant_(bias, math.log(n_neg / n_pos))
"""}, ("sign",)),
    Mistake("5.4", "the positive rate itself as the bias", {BINARY: """
return constant_(bias, n_pos / (n_pos + n_neg))
"""}, ("no logarithm",)),
    Mistake("5.4", "log counts, not log priors", {PRIORS: """
counts = np.asarray(backend.to_numpy(counts.array if isinstance(counts, Tensor) else counts), np.float64)
return _fill(bias, bias.xp.asarray(np.log(counts)))
"""}, ("missing normalization",)),
    Mistake("5.4", "one mean over every output", {REGRESSION: """
values = targets.array if isinstance(targets, Tensor) else targets
values = np.asarray(backend.to_numpy(values), dtype=np.float64)
return _fill(bias, bias.xp.full(bias.shape, values.mean()))
"""}, ("wrong axis",), public_passes=True),
]
