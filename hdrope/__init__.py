"""hdrope: Higher-Dimensional Rotary Position Embedding (HD-RoPE), exact to the paper's Algorithm 2.

Depends on torch and numpy only. Public API:
- `conference_matrix`, `paley_orders`: Paley-I conference matrices.
- `mixing_basis`, `describe_basis`, `BASIS_KINDS`: orthogonal bases Q and their facts.
- `HDRotary`: the position encoding module.
- `SCALING_TYPES`, `validate_scaling`: context-extension variants with HF rope_scaling keys.
- `UserError`: the error raised for bad user input (a ValueError that names the field, value and fix).
"""

from hdrope.bases import BASIS_KINDS, BasisReport, basis_generator, describe_basis, mixing_basis
from hdrope.conference import conference_matrix, paley_orders
from hdrope.errors import UserError
from hdrope.rotary import HDRotary
from hdrope.scaling import SCALING_TYPES, validate_scaling

__all__ = [
    "BASIS_KINDS",
    "SCALING_TYPES",
    "BasisReport",
    "HDRotary",
    "UserError",
    "basis_generator",
    "conference_matrix",
    "describe_basis",
    "mixing_basis",
    "paley_orders",
    "validate_scaling",
]
__version__ = "0.1.0"
