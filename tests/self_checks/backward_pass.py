"""Contract cases for mha.tryit.backward_pass (15_backward_pass.ipynb)."""

import numpy as np

from mha import grad
from mha.tryit import backward_pass as tryit
from tests.self_checks import Case


def stub(dweights, weights):
    """The notebook's placeholder: the body not written yet."""
    return None


def by_loops(dweights, weights):
    """The right answer, one row and one entry at a time: dscores_j = sum_i g_i w_i (delta_ij - w_j)."""
    out = np.zeros_like(weights)
    S = weights.shape[-1]
    for idx in np.ndindex(*weights.shape[:-1]):
        w, g = weights[idx], dweights[idx]
        for j in range(S):
            out[idx + (j,)] = sum(g[i] * w[i] * ((i == j) - w[j]) for i in range(S))
    return out


def jacobian(w):
    """Every row's J = diag(w) - w w^T by broadcasting: (..., S, S)."""
    return w[..., :, None] * np.eye(w.shape[-1]) - w[..., :, None] * w[..., None, :]


CASES = [
    Case(tryit.check_softmax_backward,
         right=lambda: (by_loops,),
         untried=lambda: (stub,),
         wrong={"kept only diag(w)":  # J = w * eye: the -w w^T term missing
                lambda: (lambda g, w: np.einsum("...ij,...i->...j",
                                                w[..., :, None] * np.eye(w.shape[-1]), g),),
                "sign flipped": lambda: (lambda g, w: np.einsum("...ij,...i->...j", -jacobian(w), g),),
                "w * w (elementwise)": lambda: (lambda g, w: w * g - w * w * g,),
                "einsum (or sum) paired": lambda: (lambda g, w: np.einsum("...ij,...j->...j",
                                                                          jacobian(w), g),),
                "axis -2 (the queries)": lambda: (lambda g, w: w * (g - (w * g).sum(-2, keepdims=True)),),
                "missing keepdims": lambda: (lambda g, w: w * (g - (w * g).sum(-1)),),
                "whole array": lambda: (lambda g, w: w * (g - (w * g).sum()),),
                "factor w in front": lambda: (lambda g, w: g - (w * g).sum(-1, keepdims=True),),
                "np.diag": lambda: (lambda g, w: (np.diag(w) - np.outer(w, w)) @ g,),
                "needs no division": lambda: (lambda g, w: w * (g - (w * g).sum(-1, keepdims=True)
                                                                / w.sum(-1, keepdims=True)),),
                "write your own": lambda: (grad.softmax_backward,),
                "no known mistake fits": lambda: (lambda g, w: w * (g - g.mean(-1, keepdims=True)),)},
         garbage=[lambda: ("seven",), lambda: (np.zeros((2, 3, 4, 6)),), lambda: (3.5,),
                  lambda: (lambda g: g,)]),
]
