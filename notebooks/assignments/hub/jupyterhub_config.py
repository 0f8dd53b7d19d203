"""JupyterHub for a class taking Attention by Hand (see README.md next to this file).

Each user logs in with their Unix account (PAM) and gets a JupyterLab running as that user
(LocalProcessSpawner). Students see only nbgrader's student side: the *Assignments* tab
(Nbgrader -> Assignment List) and the *Validate* button. Teachers (the Unix group
`teachers`, hub admins) also get the formgrader and *Create Assignment*, on the course in
the teacher's clone of this repository (COURSE below). Everyone shares one nbgrader exchange
folder (/srv/nbgrader/exchange, set in student/nbgrader_config.py and ../nbgrader_config.py).

Run it as root (it starts each user's server as that user), from a folder for the hub's
state (its sqlite database and cookie secret are written to the current directory):

    mkdir -p /srv/jupyterhub && cd /srv/jupyterhub
    /srv/attention-by-hand/.venv/bin/jupyterhub -f /srv/attention-by-hand/notebooks/assignments/hub/jupyterhub_config.py
"""

import os
import sys

c = get_config()  # noqa: F821 (JupyterHub provides get_config)

HERE = os.path.dirname(os.path.abspath(__file__))
# The teacher's course folder (notebooks/assignments of their own clone of the repository):
# writable by the teacher (gradebook.db, submitted/, feedback/) and inside their home, since
# the formgrader only works on a course below the server's root folder (~).
COURSE = os.environ.get("ABH_COURSE_DIR",
                        os.path.expanduser("~teacher/attention-by-hand/notebooks/assignments"))
# The environment this hub runs from; it also holds JupyterLab, nbgrader and the course.
ENV_BIN = os.path.dirname(sys.executable)

# --- Who may log in -------------------------------------------------------------------
# Unix accounts, checked by PAM. Put the class in the Unix group `students` and yourself
# in `teachers` (groupadd students; groupadd teachers; usermod -aG students alice).
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.allowed_groups = {"students", "teachers"}
c.PAMAuthenticator.admin_groups = {"teachers"}  # admins: the teacher view below

# --- Where it listens -------------------------------------------------------------------
# Plain HTTP on port 8000: put it behind a TLS-terminating reverse proxy (nginx, caddy), or
# set c.JupyterHub.ssl_cert / c.JupyterHub.ssl_key and bind to https://:443.
c.JupyterHub.bind_url = "http://:8000"

# configurable-http-proxy (npm): `npm ci` in this folder installs the pinned version
# (package.json). Otherwise the hub looks for `configurable-http-proxy` on PATH.
_chp = os.path.join(HERE, "node_modules", ".bin", "configurable-http-proxy")
if os.path.exists(_chp):
    c.ConfigurableHTTPProxy.command = [_chp]

# --- Each user's server -------------------------------------------------------------------
# LocalProcessSpawner (the default): a process per user, as that user, in their home.
# For per-user CPU and memory limits use SystemdSpawner instead
# (pip install jupyterhub-systemdspawner; needs systemd):
#   c.JupyterHub.spawner_class = "systemdspawner.SystemdSpawner"
#   c.SystemdSpawner.mem_limit = "4G"
#   c.SystemdSpawner.cpu_limit = 2.0
#   c.SystemdSpawner.isolate_tmp = True
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [os.path.join(ENV_BIN, "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
# Stop servers nobody used for an hour: pip install jupyterhub-idle-culler, then
#   c.JupyterHub.services = [{"name": "idle-culler",
#                             "command": [sys.executable, "-m", "jupyterhub_idle_culler",
#                                         "--timeout=3600"]}]
#   c.JupyterHub.load_roles = [{"name": "idle-culler", "services": ["idle-culler"],
#       "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]}]


def is_teacher(spawner) -> bool:
    """Teachers are the hub's admins (the Unix group `teachers`, see admin_groups)."""
    return bool(spawner.user.admin)


def jupyter_config_path(spawner) -> str:
    """Extra Jupyter config folders for this user, searched before every other one.

    students -> hub/student: nbgrader's course id and exchange (nbgrader_config.py), the
      lab plugins formgrader / create-assignment / course-list off (labconfig/), and
      nbgrader's formgrader and course-list server extensions off (jupyter_server_config.d/).
    teachers -> the course folder (its nbgrader_config.py: the formgrader grades this
      course) and hub/teacher: every nbgrader plugin on.
    Config found here wins over the environment's and the user's own (~/.jupyter), so
    `jupyter labextension disable` run elsewhere (e.g. by `make`) does not change the view.
    """
    if is_teacher(spawner):
        return os.pathsep.join([COURSE, os.path.join(HERE, "teacher")])
    return os.path.join(HERE, "student")


c.Spawner.environment = {
    "JUPYTER_CONFIG_PATH": jupyter_config_path,  # a callable: evaluated per user at spawn
    # Terminals in JupyterLab find this environment's python, nbgrader and jupyter first.
    "PATH": os.pathsep.join([ENV_BIN, "/usr/local/bin", "/usr/bin", "/bin"]),
}
