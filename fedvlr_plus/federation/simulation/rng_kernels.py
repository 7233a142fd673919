"""Compiled kernels (numba) for the float32 initial draw of :func:`rng.normal_float32`.

A population's initial private state is hundreds of millions of draws (35,598 routers of 12,288 floats), and in
numpy every splitmix64 mix is eight element-wise passes over memory. Here the whole integer part of a draw (the
key chain's last link and the two uniforms' four mixes) runs in registers, and the cosine is a polynomial the
compiler vectorises. The draws are the same bits as numpy's: the integer part is exact, and the float part ends in
the same check as the torch-cosine path of ``rng`` (a draw near a float32 rounding boundary is recomputed with
numpy's operations), because this cosine, like torch's, may differ from numpy's in the last places.

``rng`` imports this module only for a draw, and keeps its numpy path where numba does not import. The kernels
compile on first use and are cached next to this file.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from .rng import _DROPPED, _EXPONENT, _GOLDEN, _HALF, _M1, _M2, _SMALLEST, _TAIL

#: ``φ + k · M2`` for the trailing key k = 0, 1 of Box-Muller's two uniforms (numba reads scalars, not the tuple)
_TAIL0, _TAIL1 = _TAIL
_INV_2_53 = 1.0 / 9007199254740992.0
_TWO_PI = 2.0 * np.pi

# π/2 in three pieces (fdlibm's): the first two have 33 significant bits, so k · piece is exact for the k <= 4 an
# angle in [0, 2π) needs, and the reduced angle keeps its relative accuracy even next to a multiple of π/2
_PIO2_1 = 1.57079632673412561417e00
_PIO2_2 = 6.07710050630396597660e-11
_PIO2_2T = 2.02226624879595063154e-21
_INV_PIO2 = 6.36619772367581382433e-01
# Taylor coefficients of sin and cos: on |y| <= π/4 the first omitted term is below 2^-60 of the value
_S = tuple((-1.0) ** i / math.factorial(2 * i + 1) for i in range(1, 9))
_C = tuple((-1.0) ** i / math.factorial(2 * i) for i in range(1, 10))

_S1, _S2, _S3, _S4, _S5, _S6, _S7, _S8 = _S
_C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9 = _C


@numba.njit(inline="always")
def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True)
def uniforms(first, last_term, neg_u1, angle):
    """For row r and position j: the chain ``mix(first[r] + last_term[j])``, then ``-u1`` and the angle ``u2 · 2π``
    of its two uniforms, exactly as ``rng._radius`` and ``rng._angle`` compute them."""
    n = last_term.shape[0]
    for r in range(first.shape[0]):
        h = first[r]
        base = r * n
        for j in range(n):
            a = _mix(h + last_term[j])
            z1 = _mix(_mix(a + _TAIL0) + _GOLDEN) >> np.uint64(11)
            z2 = _mix(_mix(a + _TAIL1) + _GOLDEN) >> np.uint64(11)
            neg_u1[base + j] = -(np.int64(z1) * _INV_2_53)
            angle[base + j] = (np.int64(z2) * _INV_2_53) * _TWO_PI


@numba.njit(cache=True)
def cos_times(angle, log_y, scale, out):
    """``(sqrt(-2 log_y) · cos(angle)) · scale``: Box-Muller's radius from ``log_y = log1p(-u1)`` (the same
    correctly rounded operations as ``rng._radius``), times a cosine within a few units in the last place of
    numpy's."""
    for i in range(angle.shape[0]):
        x = angle[i]
        k = np.floor(x * _INV_PIO2 + 0.5)
        y = ((x - k * _PIO2_1) - k * _PIO2_2) - k * _PIO2_2T
        z = y * y
        sin_y = y + y * z * (_S1 + z * (_S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * (_S6 + z * (_S7 + z * _S8)))))))
        cos_y = 1.0 + z * (
            _C1 + z * (_C2 + z * (_C3 + z * (_C4 + z * (_C5 + z * (_C6 + z * (_C7 + z * (_C8 + z * _C9)))))))
        )
        quadrant = np.int64(k) & 3
        v = cos_y if (quadrant & 1) == 0 else sin_y
        v = -v if (quadrant == 1 or quadrant == 2) else v
        out[i] = (np.sqrt(log_y[i] * -2.0) * v) * scale


@numba.njit(cache=True)
def round_checked(values, bits, slack, out, near):
    """``out = float32(values)``; the positions of the values within ``slack`` float64 units of a float32 rounding
    boundary, or too small for that test (as ``rng._near_float32_boundary``), go to ``near``; returns their count."""
    count = 0
    for i in range(values.shape[0]):
        b = bits[i]
        if ((b & _DROPPED) - (_HALF - slack) < slack + slack) or (b & _EXPONENT) < _SMALLEST:
            near[count] = i
            count += 1
        out[i] = np.float32(values[i])
    return count
