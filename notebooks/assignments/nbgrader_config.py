"""nbgrader configuration for the Attention by Hand course (headless: no server needed).

Run nbgrader from this folder (or through `make assignments` / `make grade`).
"""

import os

c = get_config()  # noqa: F821 (nbgrader provides get_config)
HERE = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.root = HERE
c.CourseDirectory.course_id = "attention-by-hand"
# The gradebook is a local sqlite file, never committed (it holds students' grades).
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(HERE, "gradebook.db")

# The exchange (release / fetch / submit / collect between Unix users on one machine or a
# hub). Every user's nbgrader must agree on this folder and the course id; the hub's
# student config (hub/) sets the same two. Override with NBGRADER_EXCHANGE_ROOT.
c.Exchange.root = os.environ.get("NBGRADER_EXCHANGE_ROOT", "/srv/nbgrader/exchange")

# What a student sees in place of the solution.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# A cell that runs longer than this is interrupted and scores 0; the rest still run.
# The slowest honest cell (importing torch in A2) takes a few seconds on 2 CPU cores.
# A busy grading machine must not cost points: `course.py grade` grades a notebook with a cell
# stopped at this limit once more on its own (same limit), keeps the better run and says so in
# the feedback (autograded/STUDENT/ASSIGNMENT/timeout_retry.txt records both runs).
c.Execute.timeout = 30
