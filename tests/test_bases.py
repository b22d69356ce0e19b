import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hdrope import BASIS_KINDS, describe_basis, mixing_basis
from hdrope.bases import basis_generator, pair_generator
from hdrope.commands import basis_orders
from hdrope.errors import UserError


@pytest.mark.parametrize("kind", sorted(BASIS_KINDS))
def test_every_kind_is_orthogonal(kind):
    for n in basis_orders(kind, 32):
        q = mixing_basis(kind, n, seed=3)
        assert q.dtype == np.float64
        np.testing.assert_allclose(q.T @ q, np.eye(n), atol=1e-13)


@pytest.mark.parametrize("kind", sorted(BASIS_KINDS))
def test_generator_is_skew_and_squares_to_minus_identity(kind):
    for n in basis_orders(kind, 16):
        k = basis_generator(kind, n, seed=1)
        np.testing.assert_allclose(k, -k.T, atol=0)
        np.testing.assert_allclose(k @ k, -np.eye(n), atol=1e-13)


def test_random_is_seeded_and_bit_stable():
    a, b, c = mixing_basis("random", 8, 5), mixing_basis("random", 8, 5), mixing_basis("random", 8, 6)
    assert a.tobytes() == b.tobytes()
    assert not np.array_equal(a, c)
    # Gram-Schmidt of the Gaussian: Qᵀ·G is upper triangular with a positive diagonal (QR sign fix)
    g = np.random.Generator(np.random.PCG64(5)).standard_normal((8, 8))
    r = a.T @ g
    np.testing.assert_allclose(np.tril(r, -1), 0, atol=1e-12)
    assert (np.diag(r) > 0).all()


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_columns_are_unit_norm_for_any_seed(seed):
    q = mixing_basis("random", 4, seed)
    np.testing.assert_allclose(np.linalg.norm(q, axis=0), 1.0, atol=1e-14)


def test_hadamard_and_dct_known_values():
    h = mixing_basis("hadamard", 4)
    np.testing.assert_allclose(np.abs(h), 0.5)
    d = mixing_basis("dct", 4)
    np.testing.assert_allclose(d[0], 0.5)
    np.testing.assert_allclose(d[1, 0], np.sqrt(0.5) * np.cos(np.pi / 8))


def test_k_density_matches_checked_notes():
    # ../shared/NOTES.md §1: nonzeros of K = QJQᵀ under the paper's normalisation
    assert [describe_basis("paley", n).k_nonzero for n in (4, 8, 32)] == [12, 32, 688]
    assert describe_basis("identity", 8).k_nonzero == 8


def test_describe_basis_reports_det_and_incoherence():
    r = describe_basis("paley", 4)
    assert r.det == pytest.approx(-1.0)  # the printed C4 has det −1 (NOTES §1)
    assert r.mu_q == pytest.approx(2 / np.sqrt(3))
    assert r.orthogonality_error < 1e-15


def test_paley2_generator_is_rope_itself():
    np.testing.assert_array_equal(basis_generator("paley", 2), pair_generator(2))  # det C2 = +1: K = J
    np.testing.assert_array_equal(basis_generator("identity", 2), pair_generator(2))
    assert np.linalg.det(mixing_basis("paley", 2)) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "kind,n,match",
    [("nope", 4, "identity"), ("hadamard", 6, "power of 2"), ("paley", 16, "14 or 18"), ("identity", 0, "positive")],
)
def test_bad_basis_requests(kind, n, match):
    with pytest.raises(UserError, match=match):
        mixing_basis(kind, n)
