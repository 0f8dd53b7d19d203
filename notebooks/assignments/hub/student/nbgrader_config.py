"""nbgrader for the students of Attention by Hand: which course, and where its exchange is.

The hub (../jupyterhub_config.py) puts this folder on each student's JUPYTER_CONFIG_PATH,
so the Assignments tab and `nbgrader fetch_assignment` / `submit` / `fetch_feedback` in a
terminal read it. On a hub configured otherwise (Littlest JupyterHub, Zero to JupyterHub),
copy this file to /etc/jupyter/nbgrader_config.py in the users' image instead.
The teacher's side is ../../nbgrader_config.py: both must name the same course and exchange.
"""

import os

c = get_config()  # noqa: F821 (nbgrader provides get_config)

c.CourseDirectory.course_id = "attention-by-hand"
# A folder every user can write to (mode 1777: world-writable and sticky, owned by root).
c.Exchange.root = os.environ.get("NBGRADER_EXCHANGE_ROOT", "/srv/nbgrader/exchange")
