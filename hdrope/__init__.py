"""hdrope: Higher-Dimensional Rotary Position Embedding (HD-RoPE), exact to the paper's Algorithm 2.

Depends on torch and numpy only. Public API:
- `conference_matrix`, `paley_orders`: Paley-I conference matrices.
- `mixing_basis`, `describe_basis`, `BASIS_KINDS`: orthogonal bases Q and their facts.
- `HDRotary`: the position encoding module.
- `fold_matrix`: the orthogonal B with R_Q(m) = B·R_I(m)·Bᵀ (a basis folded into W_q/W_k; the HF export uses it).
- `SCALING_TYPES`, `validate_scaling`: context-extension variants with HF rope_scaling keys.
- `UserError`: the error raised for bad user input (names the field, value and fix; not a ValueError).
"""



from hdrope.moved import lazy_exports, register

register({"hdrope.console": "sweeps.console"})  # the console assembles every package's commands

# Public names -> the submodule defining them. Imported on first use (PEP 562), so that
# `import hdrope` and the `hdrope` console's dispatch (`hdrope --help`) do not import torch.
_EXPORTS = {
    "BASIS_KINDS": "hdrope.bases",
    "BasisReport": "hdrope.bases",
    "basis_generator": "hdrope.bases",
    "describe_basis": "hdrope.bases",
    "mixing_basis": "hdrope.bases",
    "conference_matrix": "hdrope.conference",
    "paley_orders": "hdrope.conference",
    "UserError": "hdrope.errors",
    "HDRotary": "hdrope.rotary",
    "fold_matrix": "hdrope.fold",
    "SCALING_TYPES": "hdrope.scaling",
    "validate_scaling": "hdrope.scaling",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = [
    "BASIS_KINDS",
    "SCALING_TYPES",
    "BasisReport",
    "HDRotary",
    "UserError",
    "basis_generator",
    "conference_matrix",
    "describe_basis",
    "fold_matrix",
    "mixing_basis",
    "paley_orders",
    "validate_scaling",
]
__version__ = "0.1.0"
