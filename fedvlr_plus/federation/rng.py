"""Counter-based random numbers: every draw is a pure function of its coordinates.

A draw is ``splitmix64`` applied to a chain of keys such as (seed, round, client, epoch, position). A client's
negatives, shuffles and initial private parameters therefore do not depend on which other clients are trained
with it, in what order, or in which process. That is what lets the batched simulator, the sequential reference, a
resumed run and a client running alone under Flower draw exactly the same numbers, and it lets the batched
simulator draw them for all clients at once with numpy.

splitmix64: Steele, Lea, Flood, "Fast Splittable Pseudorandom Number Generators", OOPSLA 2014 (finaliser
constants as in Vigna's public-domain reference implementation).
"""
from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)

# stream tags keep draws for different purposes independent
TAG_PERM, TAG_NEG, TAG_INIT, TAG_SAMPLE, TAG_NOISE = 1, 2, 3, 4, 5


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


_MASK = (1 << 64) - 1


def _mix_int(z: int) -> int:
    """``_mix`` on a Python int (mod 2^64): scalar key prefixes are hashed without numpy overhead."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def hash64(*keys) -> np.ndarray:
    """Hash a chain of non-negative integer keys (scalars or broadcastable arrays) to uint64.

    ``h_0 = 0; h_{j+1} = mix(h_j + φ + k_j · M2); result = mix(h_n + φ)``, all mod 2^64. Put scalar keys first:
    they are chained in pure Python, and numpy only works on the array keys.
    """
    h = 0
    rest = list(keys)
    while rest and np.ndim(rest[0]) == 0:
        h = _mix_int(h + 0x9E3779B97F4A7C15 + int(rest.pop(0)) * 0x94D049BB133111EB)
    # arrays of rank >= 1 wrap around silently (numpy warns only for scalar overflow), which is what we want
    hv = np.full(1, h, dtype=np.uint64)
    for k in rest:
        k = np.atleast_1d(np.asarray(k)).astype(np.uint64)
        hv = _mix(hv + _GOLDEN + k * _M2)
    return _mix(hv + _GOLDEN)


def uniform(*keys) -> np.ndarray:
    """Uniform floats in [0, 1) with 53 random bits."""
    return (hash64(*keys) >> _S11).astype(np.float64) * (1.0 / 9007199254740992.0)


def randint(n: int, *keys) -> np.ndarray:
    """Integers in [0, n) (relative bias below n / 2^53)."""
    return np.minimum((uniform(*keys) * n).astype(np.int64), n - 1)


def normal(*keys) -> np.ndarray:
    """Standard normal draws (Box-Muller on two independent uniforms)."""
    u1 = uniform(*keys, 0)
    u2 = uniform(*keys, 1)
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
