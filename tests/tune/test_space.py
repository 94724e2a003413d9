"""Search spaces: the log-uniform transform and its share per decade, integer draws, grid enumeration, parsing."""
import math

import numpy as np
import pytest

from minidl.tune import Choice, Integer, LogUniform, Uniform, grid, parse_dimension, sample


def test_log_uniform_is_the_exact_transform_of_a_uniform_draw():
    dim, rng = LogUniform(1e-5, 1.0), np.random.default_rng(7)
    draws = [dim.sample(rng) for _ in range(200)]
    u = np.random.default_rng(7).random(200)  # the same stream of uniforms
    assert draws == [1e-5 * (1.0 / 1e-5) ** float(v) for v in u]  # x = low (high/low)^u, bit for bit
    np.testing.assert_allclose(np.log10(draws), -5 + 5 * u, rtol=0, atol=1e-12)  # log10 x is uniform on [-5, 0)


def test_log_uniform_puts_the_same_share_in_every_decade():
    # 4 decades, n draws: each share is binomial(n, 1/4)/n with standard deviation sqrt(p(1-p)/n) = 0.0031;
    # a tolerance of 5 standard deviations (0.015) fails a correct sampler with probability ~1e-6. A uniform
    # draw would put 90% of them in the top decade; log base or exponent off by 2 would skew the shares by 0.25.
    n = 20_000
    rng = np.random.default_rng(0)
    x = np.array([LogUniform(1e-6, 1e-2).sample(rng) for _ in range(n)])
    assert x.min() >= 1e-6 and x.max() < 1e-2
    shares = np.histogram(np.log10(x), bins=[-6, -5, -4, -3, -2])[0] / n
    np.testing.assert_allclose(shares, 0.25, atol=5 * math.sqrt(0.25 * 0.75 / n))
    # and against the closed form: P(x < 1e-5.5) = 0.5 / 4
    assert abs(np.mean(x < 10 ** -5.5) - 0.125) < 5 * math.sqrt(0.125 * 0.875 / n)


def test_uniform_is_not_log_uniform():
    rng = np.random.default_rng(0)
    x = np.array([Uniform(1e-6, 1e-2).sample(rng) for _ in range(5000)])
    assert np.mean(x >= 1e-3) > 0.88  # ~90% in the top decade


def test_integer_draws_cover_the_range_evenly():
    rng = np.random.default_rng(1)
    n = 12_000
    x = np.array([Integer(3, 8).sample(rng) for _ in range(n)])
    counts = np.bincount(x, minlength=9)[3:]
    assert x.min() == 3 and x.max() == 8 and all(isinstance(v, int) for v in x[:5].tolist())
    np.testing.assert_allclose(counts / n, 1 / 6, atol=5 * math.sqrt((1 / 6) * (5 / 6) / n))


def test_log_integer_draws_follow_the_log_share():
    # floor of a log-uniform draw from [1, 16): value k has probability log(k+1/k) / log(16)
    rng = np.random.default_rng(2)
    n = 20_000
    x = np.array([Integer(1, 15, log=True).sample(rng) for _ in range(n)])
    assert x.min() == 1 and x.max() == 15
    expected = np.log(np.arange(2, 17) / np.arange(1, 16)) / np.log(16)
    shares = np.bincount(x, minlength=16)[1:] / n
    np.testing.assert_allclose(shares, expected, atol=5 * math.sqrt(0.25 / n))


def test_choice_draws_every_option_evenly():
    rng = np.random.default_rng(3)
    n = 9000
    x = [Choice(["adam", "sgd", "lamb"]).sample(rng) for _ in range(n)]
    for option in ("adam", "sgd", "lamb"):
        assert abs(x.count(option) / n - 1 / 3) < 5 * math.sqrt(2 / 9 / n)


def test_grid_enumerates_the_product_last_name_fastest():
    space = {"opt": Choice(["adam", "sgd"]), "lr": LogUniform(1e-4, 1e-2), "schedule": "cosine"}
    configs = grid(space, points=3)
    assert len(configs) == 6
    assert [c["opt"] for c in configs] == ["adam"] * 3 + ["sgd"] * 3
    np.testing.assert_allclose([c["lr"] for c in configs], [1e-4, 1e-3, 1e-2] * 2, rtol=1e-12)
    assert all(c["schedule"] == "cosine" for c in configs)


def test_grid_points_of_each_kind():
    assert Uniform(0.0, 0.5).grid(3) == [0.0, 0.25, 0.5]
    assert Integer(16, 128, log=True).grid(4) == [16, 32, 64, 128]
    assert Integer(1, 3).grid(5) == [1, 2, 3]  # rounded, duplicates removed
    assert Choice([1, 2]).grid(7) == [1, 2]
    assert len(grid({"a": Uniform(0, 1), "b": Uniform(0, 1), "c": Uniform(0, 1)}, points=4)) == 64


def test_sample_draws_in_the_order_of_the_space_and_is_seeded():
    space = {"lr": LogUniform(1e-4, 1.0), "dropout": Uniform(0.0, 0.5), "bs": 32}
    a = sample(space, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    u1, u2 = rng.random(), rng.random()
    assert a == {"lr": 1e-4 * 1e4 ** u1, "dropout": 0.5 * u2, "bs": 32}
    assert sample(space, np.random.default_rng(6)) != a


@pytest.mark.parametrize("text, expected", [
    ("log:1e-4:1e-1", LogUniform(1e-4, 1e-1)), ("uniform:0:0.5", Uniform(0, 0.5)),
    ("int:16:128", Integer(16, 128)), ("logint:16:256", Integer(16, 256, log=True)),
])
def test_parse_dimension(text, expected):
    assert repr(parse_dimension(text)) == repr(expected)


def test_parse_choice_and_constants():
    assert parse_dimension("choice:adam,sgd").options == ["adam", "sgd"]
    assert parse_dimension("choice:16,32,0.5").options == [16, 32, 0.5]
    assert parse_dimension("64") == 64 and parse_dimension("1e-3") == 1e-3 and parse_dimension("adam") == "adam"


@pytest.mark.parametrize("make", [lambda: LogUniform(0, 1), lambda: LogUniform(1, 1), lambda: Uniform(2, 1),
                                  lambda: Integer(1.5, 3), lambda: Choice([]), lambda: parse_dimension("log:1")])
def test_bad_ranges_are_refused(make):
    with pytest.raises(ValueError):
        make()


def test_grid_needs_a_positive_point_count():
    with pytest.raises(ValueError, match="points"):
        grid({"a": Uniform(0, 1)}, points=0)
