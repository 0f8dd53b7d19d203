"""Contract cases for mha_course.tryit.backward_pass (15_backward_pass.ipynb)."""

import numpy as np
import torch

from mha.training import grad
from mha_course import planted
from mha_course.tryit import backward_pass as tryit
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


def eye_of_queries(g, w):
    """J built with np.eye(T), the number of queries, where S, the number of keys, belongs."""
    column = w[..., :, None]  # (B, h, T, S, 1)
    J = column * np.eye(w.shape[-2]) - column * w[..., None, :]
    return np.einsum("...ij,...i->...j", J, g)


def right_by_einsum(g, w):
    return np.einsum("...ij,...i->...j", jacobian(w), g)


CASES = [
    Case(tryit.check_softmax_backward,
         right=lambda: (by_loops,),
         untried=lambda: (stub,),
         right_forms=[lambda: (lambda g, w: np.einsum("...ij,...j->...i", jacobian(w), g),),  # J is symmetric
                      lambda: (lambda g, w: (jacobian(w) @ g[..., :, None])[..., 0],),
                      lambda: (lambda g, w: torch.from_numpy(right_by_einsum(g, w)),),
                      lambda: (lambda g, w: right_by_einsum(g, w).tolist(),),
                      lambda: (lambda g, w: right_by_einsum(g.astype(np.float32), w.astype(np.float32)),)],
         wrong={"the two arguments swapped":
                lambda: (lambda w, g: np.einsum("...ij,...i->...j", jacobian(w), g),),
                "the weights where the upstream gradient belongs":
                lambda: (lambda g, w: np.einsum("...ij,...i->...j", jacobian(w), w),),
                "squares of one row":  # J_ij = w_i delta_ij - w_j^2
                lambda: (lambda g, w: np.einsum("...ij,...i->...j", w[..., :, None] * np.eye(
                    w.shape[-1]) - (w * w)[..., None, :], g),),
                "-w_i^2 across row i":  # J_ij = w_i delta_ij - w_i^2
                lambda: (lambda g, w: np.einsum("...ij,...i->...j", w[..., :, None] * np.eye(
                    w.shape[-1]) - (w * w)[..., :, None], g),),
                "kept only diag(w)":  # J = w * eye: the -w w^T term missing
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
                # the finding: the package's own gradient is not the student's work
                "the package's own mha.training.grad.softmax_backward": lambda: (grad.softmax_backward,),
                "answer key": lambda: (lambda g, w: grad.softmax_backward(g, w),),
                "mha_course.planted": lambda: (planted.softmax_no_outer_product,),
                "(S, S), S the number of keys": lambda: (eye_of_queries,),
                "return J itself": lambda: (lambda g, w: jacobian(w),),
                "outer product's sign": lambda: (lambda g, w: np.einsum(
                    "...ij,...i->...j", jacobian(w) + 2 * w[..., :, None] * w[..., None, :], g),),
                "without its identity": lambda: (lambda g, w: np.einsum(
                    "...ij,...i->...j", w[..., :, None] - w[..., :, None] * w[..., None, :], g),),
                "returned None": lambda: (lambda g, w: None if g.shape[-1] != w.shape[-1] or w.shape[-2] == 5
                                          else right_by_einsum(g, w),),
                # unlisted wrong answers: named by how they relate to the right dscores
                "should each sum to 0": lambda: (lambda g, w: w * (g - g.mean(-1, keepdims=True)),),
                "2 times the right one": lambda: (lambda g, w: 2 * right_by_einsum(g, w),),
                "axes in another order": lambda: (lambda g, w: right_by_einsum(g, w).swapaxes(-1, -2),)},
         garbage=[lambda: ("seven",), lambda: (np.zeros((2, 3, 4, 6)),), lambda: (3.5,),
                  lambda: (lambda g: g,), lambda: (lambda g, w: "seven",),
                  lambda: (lambda g, w: (g, w),)],
         # the fixes the old messages printed: the answer's formula and its einsum
         secret=["w * (g - sum(", "sum(w * g, axis=-1, keepdims=True)", "einsum('...ij,...i->...j'",
                 "w[..., :, None] * np.eye"]),
]
