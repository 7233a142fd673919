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

from ...compiled import LazyKernels

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)

# stream tags keep draws for different purposes independent
TAG_PERM, TAG_NEG, TAG_INIT, TAG_SAMPLE, TAG_NOISE = 1, 2, 3, 4, 5
#: which warm items the FedVLR server reads through their content neighbours in a round (fedvlr.layer); 6 is
#: federation.decoys'
TAG_DROP = 8


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


def _chain(keys) -> np.ndarray:
    """``h_n`` of :func:`hash64` (before its final mix) for ``keys``, as a uint64 array."""
    h = 0
    rest = list(keys)
    while rest and np.ndim(rest[0]) == 0:
        h = _mix_int(h + 0x9E3779B97F4A7C15 + int(rest.pop(0)) * 0x94D049BB133111EB)
    # arrays of rank >= 1 wrap around silently (numpy warns only for scalar overflow), which is what we want
    hv = np.full(1, h, dtype=np.uint64)
    for k in rest:
        k = np.atleast_1d(np.asarray(k)).astype(np.uint64)
        hv = _mix(hv + _GOLDEN + k * _M2)
    return hv


def hash64(*keys) -> np.ndarray:
    """Hash a chain of non-negative integer keys (scalars or broadcastable arrays) to uint64.

    ``h_0 = 0; h_{j+1} = mix(h_j + φ + k_j · M2); result = mix(h_n + φ)``, all mod 2^64. Put scalar keys first:
    they are chained in pure Python, and numpy only works on the array keys.
    """
    return _mix(_chain(keys) + _GOLDEN)


def uniform(*keys) -> np.ndarray:
    """Uniform floats in [0, 1) with 53 random bits."""
    return (hash64(*keys) >> _S11).astype(np.float64) * (1.0 / 9007199254740992.0)


def randint(n: int, *keys) -> np.ndarray:
    """Integers in [0, n) (relative bias below n / 2^53)."""
    return np.minimum((uniform(*keys) * n).astype(np.int64), n - 1)


def normal(*keys) -> np.ndarray:
    """Standard normal draws (Box-Muller on two independent uniforms, ``uniform(*keys, 0)`` and
    ``uniform(*keys, 1)``).

    Bit for bit what those two calls give, at a fraction of their cost: the chain over ``keys`` is hashed once
    for both uniforms, block by block along the first axis so that every temporary stays cache-sized, and the
    remaining mixes run in place (a client's initial router is tens of thousands of draws, a population's is
    hundreds of millions)."""
    shape, blocks = _key_blocks(keys)
    out = np.empty(shape, dtype=np.float64)
    for i0, i1, a, (zb, tb, ub) in blocks:
        ob = out[i0:i1].reshape(-1)
        _radius(a, zb, tb, ob)
        _angle(a, zb, tb, ub)
        np.cos(ub, out=ub)
        ob *= ub
    return out


def normal_float32(*keys, scale: float = 1.0) -> np.ndarray:
    """``(normal(*keys) * scale).astype(np.float32)``, bit for bit, for a fraction of the cost.

    numpy's float64 cosine is scalar library code and costs most of a draw; torch's vectorised one is within one
    unit in the last place of it. A draw computed with torch's cosine is kept when every float64 within
    ``_SLACK_ULPS`` units of it (far more than the two cosines can make the draws differ by) rounds to the same
    float32; the few that lie near a float32 rounding boundary are recomputed with numpy's cosine. A population's
    draw (the matrix layout of :func:`_row_layout`, once a process has drawn ``COMPILED_AFTER_DRAWS`` values in it)
    runs through the compiled kernels of ``rng_kernels`` instead, with the same check and the same bits."""
    import torch  # the package's dependency; rng itself stays importable with numpy alone

    rows = _row_layout(keys)
    kernels = _compiled_kernels_for(rows[0].size * rows[1].size) if rows is not None else None
    if kernels is not None:
        return _normal_float32_compiled(kernels, *rows, scale)
    shape, blocks = _key_blocks(keys)
    out = np.empty(shape, dtype=np.float32)
    radius_buffer, fast_buffer = None, None
    for i0, i1, a, (zb, tb, ub) in blocks:
        if radius_buffer is None:  # (reused: a population's draw is thousands of blocks)
            radius_buffer, fast_buffer = np.empty_like(ub), np.empty_like(ub)
        radius, fast = radius_buffer[: ub.size], fast_buffer[: ub.size]
        _radius(a, zb, tb, radius)
        _angle(a, zb, tb, ub)
        torch.cos(torch.from_numpy(ub), out=torch.from_numpy(fast))
        fast *= radius
        fast *= scale
        near = np.flatnonzero(_near_float32_boundary(fast.view(np.uint64), zb, tb))
        fast[near] = (radius[near] * np.cos(ub[near])) * scale  # the same operations as ``normal``
        out[i0:i1].reshape(-1)[:] = fast
    return out


#: values a process draws in the matrix layout (:func:`_row_layout`) before :func:`normal_float32` switches to the
#: compiled kernels: importing numba and loading them costs about 0.6 s CPU, what numpy takes for some 25 M draws,
#: so a small run (ml-100k's 943 routers are 11.6 M draws) never imports numba, and a population does after a few
#: chunks
COMPILED_AFTER_DRAWS = 1 << 24
_KERNELS = LazyKernels("fedvlr_plus.federation.simulation.rng_kernels")


def _compiled_kernels_for(n_draws: int):
    """The compiled kernels for a draw of ``n_draws`` in the matrix layout, or None (then numpy draws it)."""
    return _KERNELS.once_worth_it(n_draws, COMPILED_AFTER_DRAWS)


def _compiled_kernels():
    """The ``rng_kernels`` module, or None where numba does not import (the numpy path then gives the same bits)."""
    return _KERNELS.get()


def prepare_kernels() -> bool:
    """Compile the draw's numba kernels, or load them from numba's cache, with one tiny draw through them; False
    where numba is missing (draws then take the numpy path, with the same bits). Compiling happens once per
    installation (numba caches the machine code next to ``rng_kernels.py``); ``bench suite`` calls this before
    its cases so that their round 1 is what every later run pays, and reports the one-time cost apart."""
    rows = _row_layout((0, TAG_INIT, 0, np.arange(2)[:, None], np.arange(3)[None, :]))
    return _KERNELS.prepare(lambda kernels: _normal_float32_compiled(kernels, *rows, 1.0))


def _row_layout(keys):
    """``(first, last_term)`` when ``keys`` lay out a matrix whose last key is its column (the layout of a
    population's initial draw, ``(..., clients[:, None], positions[None, :])``): the chain of every other key per
    row, and the last key's term of the chain per column. None for any other layout."""
    keys = list(keys)
    n_scalar = next((i for i, k in enumerate(keys) if np.ndim(k) > 0), len(keys))
    arrays = [np.asarray(k) for k in keys[n_scalar:]]
    if len(arrays) < 2 or any(a.ndim != 2 for a in arrays):
        return None
    last, others = arrays[-1], arrays[:-1]
    row_shape = np.broadcast_shapes(*(a.shape for a in others))
    if last.shape[0] != 1 or row_shape[1] != 1:
        return None
    first = np.ascontiguousarray(_chain(keys[:n_scalar] + others).reshape(-1))
    last_term = last.reshape(-1).astype(np.uint64) * _M2 + _GOLDEN
    return first, last_term


def _rows_per_block(n_rows: int, row: int) -> tuple[int, int]:
    """Whole rows of ``row`` draws per block of about ``_BLOCK`` draws, and the buffer size that block needs."""
    step = max(1, _BLOCK // max(row, 1))
    return step, min(step, n_rows) * row


def _normal_float32_compiled(kernels, first, last_term, scale: float) -> np.ndarray:
    """:func:`normal_float32` of a matrix layout (:func:`_row_layout`) with the compiled kernels, block by block
    of whole rows; the same bits as the numpy path."""
    n_rows, n_cols = first.size, last_term.size
    out = np.empty((n_rows, n_cols), dtype=np.float32)
    step, size = _rows_per_block(n_rows, n_cols)
    neg_u1, angle, fast = np.empty(size), np.empty(size), np.empty(size)
    near = np.empty(size, dtype=np.int64)
    slack = np.uint64(_SLACK_ULPS)
    for r0 in range(0, n_rows, step):
        r1 = min(r0 + step, n_rows)
        n = (r1 - r0) * n_cols
        log_y, a, f = neg_u1[:n], angle[:n], fast[:n]
        kernels.uniforms(first[r0:r1], last_term, log_y, a)
        np.log1p(log_y, out=log_y)  # numpy's vectorised log1p, as in ``_radius``
        kernels.cos_times(a, log_y, float(scale), f)
        block = out[r0:r1].reshape(-1)
        count = kernels.round_checked(f, f.view(np.uint64), slack, block, near)
        redo = near[:count]
        block[redo] = (np.sqrt(log_y[redo] * -2.0) * np.cos(a[redo])) * scale  # ``normal``'s operations
    return out


#: how many float64 units in the last place a fast-cosine draw may be from numpy's and still be kept without a
#: check: torch's and numpy's cosines differ by at most one, which the two products can make three; 2^12 leaves
#: a wide margin and flags only about one draw in 2^16 for recomputation
_SLACK_ULPS = 1 << 12
_DROPPED = np.uint64((1 << 29) - 1)  # the 29 mantissa bits a float64 loses on rounding to float32
_EXPONENT = np.uint64(0x7FF << 52)
_SMALLEST = np.uint64((1023 - 125) << 52)  # below it, float32's grid is not 2^-23 of the binade (subnormals)
_HALF = np.uint64(1 << 28)  # the dropped bits of a float32 rounding boundary: 1 and then zeros


def _near_float32_boundary(bits: np.ndarray, tmp: np.ndarray, tmp2: np.ndarray) -> np.ndarray:
    """Whether each float64 (``bits``: its bit pattern) lies within ``_SLACK_ULPS`` units of a float32 rounding
    boundary (a midpoint between two float32s: the dropped bits are 1 followed by zeros), or is too small for
    that test; any float64 within that many units of it then rounds to the same float32 when it is False."""
    half, slack = _HALF, np.uint64(_SLACK_ULPS)
    np.bitwise_and(bits, _DROPPED, out=tmp)
    tmp -= half - slack  # (wraps around below the window)
    near = tmp < slack + slack
    np.bitwise_and(bits, _EXPONENT, out=tmp2)
    near |= tmp2 < _SMALLEST
    return near


def _key_blocks(keys):
    """The broadcast shape of ``keys`` and an iterator over its blocks of whole rows along the first axis:
    ``(i0, i1, chain, buffers)`` with the chain of every key but the two uniforms' own, flat, and three
    reusable buffers (uint64, uint64, float64) of the block's size."""
    keys = list(keys)
    n_scalar = next((i for i, k in enumerate(keys) if np.ndim(k) > 0), len(keys))
    arrays = [np.asarray(k) for k in keys[n_scalar:]]
    shape = np.broadcast_shapes(*(a.shape for a in arrays)) if arrays else (1,)
    arrays = [a.reshape((1,) * (len(shape) - a.ndim) + a.shape) for a in arrays]
    row = int(np.prod(shape[1:], dtype=np.int64))
    step, size = _rows_per_block(shape[0], row)
    buffers = tuple(np.empty(size, dtype=t) for t in (np.uint64, np.uint64, np.float64))
    # the last key is usually the element's position, the same for every block: its term of the chain is added
    # to the other keys' chain in a reused buffer and mixed in place (the chain is as large as the draw)
    last_fixed = len(arrays) > 1 and arrays[-1].shape[0] == 1
    if last_fixed:
        last_term = np.atleast_1d(arrays[-1]).astype(np.uint64) * _M2 + _GOLDEN
        chain = np.empty(size, dtype=np.uint64)

    def blocks():
        for i0 in range(0, shape[0], step):
            i1 = min(i0 + step, shape[0])
            block = [a[i0:i1] if a.shape[0] > 1 else a for a in arrays]
            if last_fixed:
                first = _chain(keys[:n_scalar] + block[:-1])
                a = chain[: (i1 - i0) * row]
                np.add(
                    first.reshape(first.shape + (1,) * (len(shape) - first.ndim)),
                    last_term,
                    out=a.reshape((i1 - i0,) + tuple(shape[1:])),
                )
                _mix_inplace(a, buffers[0][: a.size])
            else:
                a = np.broadcast_to(_chain(keys[:n_scalar] + block), (i1 - i0,) + tuple(shape[1:])).reshape(-1)
            yield i0, i1, a, tuple(b[: a.size] for b in buffers)

    return shape, blocks()


def _radius(a: np.ndarray, z: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """Box-Muller's radius ``sqrt(-2 log(1 - u1))`` into ``out`` (``u1`` from the chain ``a``)."""
    _last_two(a, _TAIL[0], z, tmp, out)
    np.negative(out, out=out)
    np.log1p(out, out=out)
    out *= -2.0
    np.sqrt(out, out=out)


def _angle(a: np.ndarray, z: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """Box-Muller's angle ``2π u2`` into ``out``."""
    _last_two(a, _TAIL[1], z, tmp, out)
    out *= 2.0 * np.pi


#: elements per block of :func:`normal` (a few uint64 blocks fit in a core's L2 cache)
_BLOCK = 1 << 15
#: ``φ + k · M2`` for the trailing key k = 0, 1 of the two uniforms
_TAIL = (np.uint64(0x9E3779B97F4A7C15), np.uint64((0x9E3779B97F4A7C15 + 0x94D049BB133111EB) & _MASK))


def _mix_inplace(z: np.ndarray, tmp: np.ndarray) -> None:
    for shift, mult in ((_S30, _M1), (_S27, _M2)):
        np.right_shift(z, shift, out=tmp)
        z ^= tmp
        z *= mult
    np.right_shift(z, _S31, out=tmp)
    z ^= tmp


def _last_two(a: np.ndarray, tail: np.uint64, z: np.ndarray, tmp: np.ndarray, u: np.ndarray) -> None:
    """``u = uniform(..., k)`` from the chain ``a`` of the other keys: ``mix(mix(a + φ + k·M2) + φ) >> 11``."""
    np.add(a, tail, out=z)
    _mix_inplace(z, tmp)
    z += _GOLDEN
    _mix_inplace(z, tmp)
    z >>= _S11
    # 53-bit values convert exactly from int64, and much faster than from uint64
    np.multiply(z.view(np.int64), 1.0 / 9007199254740992.0, out=u)
