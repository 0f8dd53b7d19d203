"""Student answers written blind to the Try-it checks, kept as a regression test.

Each set was written by someone who read the lessons but not the checks (src/mha_course/tryit/,
tests/self_checks/), as new students would: set B (answers_b.py, 268 answers) and set C
(answers_c.py, 253 answers, three personas: hurried, consistently confused, coming from
TensorFlow or JAX). About three in four are wrong answers of the writer's own invention, the
rest right answers in other forms. tests/test_outsider_answers.py runs them all.
"""
