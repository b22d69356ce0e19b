import numpy as np
import pytest

from hdrope import conference_matrix, paley_orders
from hdrope.errors import UserError
from hdrope.galois import galois_field, prime_power

PAPER_C4 = np.array([[0, 1, 1, 1], [1, 0, -1, 1], [1, 1, 0, -1], [1, -1, 1, 0]])


def test_c4_is_the_papers():
    c = conference_matrix(4)
    assert c.dtype == np.int8
    np.testing.assert_array_equal(c, PAPER_C4)


@pytest.mark.parametrize("n", paley_orders(128))
def test_conference_property_every_paley_order(n):
    c = conference_matrix(n).astype(np.int64)
    assert (np.diag(c) == 0).all()
    np.testing.assert_array_equal(c @ c.T, (n - 1) * np.eye(n, dtype=np.int64))
    # the paper's normalisation: row 0 and column 0 all +1 except the corner; order 2 is the det +1 one
    # ([[0, 1], [-1, 0]]), so that N = 2 Paley is RoPE itself, not its mirror (NOTES §1)
    assert (c[0, 1:] == 1).all() and (c[1:, 0] == (1 if n > 2 else -1)).all()
    if n == 2:
        assert round(np.linalg.det(c)) == 1


@pytest.mark.parametrize("q", [9, 25, 27, 49, 81, 121, 125])
def test_prime_power_orders_use_real_field_arithmetic(q):
    assert q + 1 in paley_orders(130)
    f = galois_field(q)
    # field axioms spot checks: every nonzero element has an inverse, and exactly half are squares
    for a in range(1, q):
        assert any(f.mul(a, b) == 1 for b in range(1, q))
    assert len(f.squares) == (q - 1) // 2
    # a genuine extension field: the modulus has degree k, not the prime field's degree 1
    assert len(f.modulus) == prime_power(q)[1]


def test_paley_orders_list():
    assert paley_orders(32) == [2, 4, 6, 8, 10, 12, 14, 18, 20, 24, 26, 28, 30, 32]


@pytest.mark.parametrize("n,near", [(16, "14 or 18"), (22, "20 or 24"), (34, "32 or 38")])
def test_missing_order_names_nearest(n, near):
    with pytest.raises(UserError, match=near):
        conference_matrix(n)


@pytest.mark.parametrize("bad", [0, 1, 3, 2.0, "4", True])
def test_bad_orders_raise(bad):
    with pytest.raises(UserError):
        conference_matrix(bad)
