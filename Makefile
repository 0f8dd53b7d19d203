# Attention by Hand. Quickstart: `make lab` (learn) and `make test` (check everything).
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check
# Installs go through tools/install.py: uv where it can (same indexes as pip, about a
# minute instead of three on 2 cores), else pip; INSTALLER=pip never tries uv.
INSTALLER ?= auto
INSTALL := $(BIN)/python tools/install.py --with $(INSTALLER)
PORT   ?= 8888
# Extra flags for jupyter lab, e.g. LAB_ARGS=--IdentityProvider.token=secret
LAB_ARGS ?=
# pytest-xdist workers; notebooks must stay whole per worker (--dist loadscope).
JOBS   ?= 2
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
COURSE    := notebooks/assignments
SITE      := _site
REPORTS   := .ci-reports
# nbgrader's JupyterLab menus are for teachers: `make lab` hides them unless TEACHER=1.
TEACHER ?= 0

.PHONY: lab test lint unit site site-test notebooks demo bench assignments grade report nbgrader-ui clean help
.PHONY: student-pack gpu-check
.PHONY: lab-zh fonts-zh i18n-check
.PHONY: assignment check similarity canvas

help:
	@echo "make lab        create $(VENV), install, open JupyterLab on notebooks/ (CPU=1 / CPU=0: force torch's CPU-only / default build)"
	@echo "make test       install dev tools, then ruff + unit tests + nbval over every notebook + the site"
	@echo "make notebooks  re-execute every notebook in place (fresh kernel, top to bottom)"
	@echo "make site       the series as a book in English and Chinese, offline, in $(SITE)/ (open $(SITE)/index.html)"
	@echo "make lab-zh     the Chinese notebooks (from the zh_CN catalogs) into notebooks/zh_CN/, opened in JupyterLab"
	@echo "make i18n-check fail on an untranslated, fuzzy or broken entry in any zh_CN catalog"
	@echo "make demo       python -m mha: a one-screen terminal demo"
	@echo "make bench      time numpy vs torch SDPA backends (benchmarks/results/)"
	@echo "make gpu-check  on a CUDA machine: CUDA tests, GPU lessons, SDPA + Triton benchmarks (benchmarks/results/gpu-check/)"
	@echo "make assignments  build the students' versions of the graded assignments"
	@echo "make student-pack  dist/: lessons, released assignments, mha and install files for students (no answers; LANG=zh_CN: the Chinese edition)"
	@echo "make grade      autograde $(COURSE)/submitted/, write feedback and grade CSVs (A=A1 STUDENT=alice)"
	@echo "make report     feedback and CSVs again after hand-grading written answers"
	@echo "make similarity A=A4  which submissions look copied from each other (reports/similarity_*.html)"
	@echo "make canvas ROSTER=export.csv IDS=\"A4=123\"  the grades as Canvas's gradebook imports them"
	@echo "make assignment A=A1  self-study: the released A1 (no answers) into $(WORK)/A1/ (LANG=zh_CN: in Chinese)"
	@echo "make check A=A1       self-study: grade $(WORK)/A1/ with the course's autograder (OPEN=1 opens the feedback)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Which torch build: CPU=auto (default) installs torch's CPU-only wheel first (a few hundred MB,
# so the pinned torch in requirements.txt is already satisfied and PyPI's CUDA build of several
# GB is never fetched) on Linux without an NVIDIA driver, unless the package index already gives
# a CPU build; tools/torch_build.py decides and says why. CPU=1 forces the CPU wheel, CPU=0
# PyPI's default build.
CPU ?= auto
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIN := $(shell grep -E '^torch==' requirements.txt)

# Stamps: reinstall only when the requirement files or pyproject change.
$(VENV)/.lab-installed: requirements.txt pyproject.toml | $(BIN)/python
	@echo "Installing into $(VENV): a minute or a few the first time, with progress as it goes."
	@if [ "$$($(BIN)/python tools/torch_build.py --cpu $(CPU) --pin "$(TORCH_PIN)")" = cpu ]; then \
	  $(INSTALL) --index-url $(TORCH_CPU_INDEX) "$(TORCH_PIN)"; fi
	$(INSTALL) -r requirements.txt
	@# jsonschema's "format-nongpl" extra (via jupyter-events) pulls in rfc3987-syntax, which
	@# builds a Lark grammar on import: 1-2 s in EVERY Jupyter process (nbconvert, nbgrader, each
	@# grading worker). It only checks "iri" strings in event schemas, which nothing here emits;
	@# jsonschema skips the format without it. Nothing declares it as a requirement.
	@$(PIP) uninstall -y -q rfc3987-syntax 2>/dev/null || true
	@touch $@

$(VENV)/.dev-installed: requirements-dev.txt $(VENV)/.lab-installed
	$(INSTALL) -q -r requirements-dev.txt
	@$(PIP) uninstall -y -q rfc3987-syntax 2>/dev/null || true  # see .lab-installed: 1-2 s per process
	@# configurable-http-proxy for the hub test (npm; .ci/run insists, a laptop may skip it)
	@if command -v npm >/dev/null && ! [ -x $(COURSE)/hub/node_modules/.bin/configurable-http-proxy ]; then \
	  npm ci --prefix $(COURSE)/hub --no-audit --no-fund --loglevel=error >/dev/null || true; fi
	@$(MAKE) -s nbgrader-ui TEACHER=0
	@touch $@

# Show (TEACHER=1) or hide nbgrader's JupyterLab extension; a no-op where nbgrader is absent.
nbgrader-ui:
	@if [ -x $(BIN)/nbgrader ]; then \
	  $(BIN)/jupyter labextension $(if $(filter 1,$(TEACHER)),enable,disable) \
	    --level=sys_prefix @jupyter/nbgrader >/dev/null 2>&1; \
	fi

# Students are not asked whether JupyterLab may fetch Jupyter's news, and it never checks for
# updates: lab-wide overrides in the venv (a user's own settings still win).
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
$(LAB_OVERRIDES): | $(VENV)/.lab-installed
	@mkdir -p $(dir $@)
	@echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $@

# Trusting our own notebooks lets JupyterLab render their widgets and HTML outputs.
# TEACHER=1 also points nbgrader's formgrader at the course (its nbgrader_config.py).
lab: $(VENV)/.lab-installed $(LAB_OVERRIDES) nbgrader-ui
	@$(BIN)/jupyter trust $(NOTEBOOKS) >/dev/null
	$(if $(filter 1,$(TEACHER)),JUPYTER_CONFIG_PATH=$(abspath $(COURSE)),) \
	$(BIN)/jupyter lab --no-browser --ip=127.0.0.1 --port=$(PORT) \
	  --ServerApp.root_dir=notebooks $(LAB_ARGS) $(if $(filter 0,$(shell id -u)),--allow-root,)

# The Chinese edition in JupyterLab: the lessons written again from the zh_CN catalogs into
# notebooks/zh_CN/ (same code cells and outputs; not committed), with a `.mha-language` file
# that makes the Try-it checks and the figures speak Chinese; a CJK font for the figures first.
ZH_NOTEBOOKS := notebooks/zh_CN
lab-zh: $(VENV)/.lab-installed $(LAB_OVERRIDES) nbgrader-ui fonts-zh
	$(BIN)/python -m tools.book.i18n notebooks $(ZH_NOTEBOOKS)
	@$(BIN)/jupyter trust $(ZH_NOTEBOOKS)/*.ipynb >/dev/null
	$(BIN)/jupyter lab --no-browser --ip=127.0.0.1 --port=$(PORT) \
	  --ServerApp.root_dir=$(ZH_NOTEBOOKS) $(LAB_ARGS) $(if $(filter 0,$(shell id -u)),--allow-root,)

# A CJK-capable font for figures with Chinese words: a system one when matplotlib can find it
# (Debian: fonts-wqy-microhei or fonts-noto-cjk), else the noto-cjk-sans-otc wheel (15 MB).
fonts-zh: $(VENV)/.lab-installed
	@$(BIN)/python -W ignore -c "from mha_course.i18n import cjk_font; raise SystemExit(cjk_font() is None)" \
	  || $(PIP) install -q "noto-cjk-sans-otc==0.0.1"
	@$(BIN)/python -c "from mha_course.i18n import cjk_font; print('figures in Chinese use', cjk_font())"

test: $(VENV)/.dev-installed lint i18n-check unit site-test

# Every zh_CN catalog complete: the lessons', assignments' and pages' (tools.book.i18n) and the
# course's messages (tools.book.messages); an entry is bad when missing, fuzzy (its English
# changed) or when it drops a code span, a formula, a link, a placeholder or a list item.
i18n-check: $(VENV)/.dev-installed
	$(BIN)/python -m tools.book.i18n stat --strict > /dev/null
	$(BIN)/python -m tools.book.messages stat --strict > /dev/null
	$(BIN)/python $(COURSE)/student_pack.py --check-readme-catalog > /dev/null

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check src tests notebooks tools $(wildcard benchmarks)

# Unit tests and every notebook in one pytest run, so one summary line covers all. Its junit
# report gives the site's checks page each notebook's runtime; the site's own browser test
# runs after the site is built (site-test).
unit: $(VENV)/.dev-installed nbgrader-ui fonts-zh
	@mkdir -p $(REPORTS)
	$(BIN)/python -m pytest tests $(NOTEBOOKS) --ignore=tests/test_book.py \
	  --nbval-lax --nbval-current-env --nbval-cell-timeout=300 \
	  -n $(JOBS) --dist loadscope --junitxml=$(REPORTS)/junit.xml $(PYTEST_ARGS)

# The book in $(SITE)/: $(SITE)/en/ and $(SITE)/zh_CN/ (Sphinx, myst-nb, sphinx-book-theme;
# tools/book/), from the committed outputs, offline; a Sphinx warning fails the build.
site: $(VENV)/.dev-installed
	$(BIN)/python -m tools.book $(SITE) --junit $(REPORTS)/junit.xml

# Read the built book in headless Chromium with the network cut: both editions, both themes,
# search in both languages, every link and anchor.
site-test: site
	@mkdir -p $(REPORTS)
	SITE_DIR=$(SITE) $(BIN)/python -m pytest tests/test_book.py -n $(JOBS) \
	  --junitxml=$(REPORTS)/junit-site.xml $(PYTEST_ARGS)

notebooks: $(VENV)/.dev-installed
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	  --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.kernel_name=python3 $(NOTEBOOKS)

# CPU (and CUDA when present) timing sweep; writes CSV + plot under benchmarks/results/.
bench: $(VENV)/.dev-installed
	$(BIN)/python benchmarks/sdpa_backends.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/flash_kv.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/flash_blocks.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/generation.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/llama_attention.py $(BENCH_ARGS)

# The GPU half in one go (benchmarks/gpu_check.py): every CUDA test, nbval of the lessons with
# GPU cells, the SDPA and Triton benchmarks, with the torch, CUDA, cuDNN, triton and driver
# versions, into benchmarks/results/gpu-check/summary.md; about 4 minutes on one H200, 8 at
# most. Without an NVIDIA driver it says so and exits 0 before installing anything. With one,
# it installs $(VENV) first if needed (CPU=auto then takes PyPI's CUDA build; that needs PyPI
# once). Offline, GPU_PYTHON=python3 runs with that interpreter and src/ instead: it must have
# torch's CUDA build, pytest, pytest-xdist, nbval, hypothesis, triton, matplotlib and tqdm.
# GPU_CHECK_ARGS="--only sdpa-bench" runs one step again.
GPU_PYTHON ?=
gpu-check:
	@$(firstword $(GPU_PYTHON) $(wildcard $(BIN)/python) python3) benchmarks/gpu_check.py --preflight; \
	rc=$$?; if [ $$rc = 3 ]; then exit 0; elif [ $$rc != 0 ]; then exit $$rc; fi; \
	$(if $(GPU_PYTHON),,$(MAKE) --no-print-directory $(VENV)/.dev-installed &&) \
	$(if $(GPU_PYTHON),PYTHONPATH=src$(if $(PYTHONPATH),:$(PYTHONPATH)) $(GPU_PYTHON),$(BIN)/python) \
	  benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# Graded assignments (nbgrader, headless): see notebooks/assignments/README.md.
assignments: $(VENV)/.dev-installed
	$(BIN)/python $(COURSE)/course.py release

# What to hand out: dist/student-pack/ and dist/attention-by-hand-student.zip, checked for leaks.
# LANG=zh_CN: the Chinese edition (`make student-pack LANG=zh_CN`, `make assignment A=A1 LANG=zh_CN`).
# Only that exact value counts: the shell's own LANG (en_US.UTF-8, zh_CN.UTF-8) chooses nothing.
# Given on make's command line it also becomes the tools' locale (GB2312 where a zh_CN locale is
# installed), so they run without it (`env -u LANG`: Python falls back to UTF-8).
EDITION_ARGS = $(if $(filter zh_CN,$(LANG)),--lang zh_CN)
EDITION_ENV  = $(if $(filter zh_CN,$(LANG)),env -u LANG )

student-pack: $(VENV)/.dev-installed
	$(EDITION_ENV)$(BIN)/python $(COURSE)/student_pack.py $(EDITION_ARGS)

# A=A1 (or several: A="A1 A3") grades one assignment, STUDENT=alice one student (both: both);
# WORKERS=N sets the grading processes (default: one per core). Hand grades survive a regrade.
GRADE_ARGS = $(A) $(foreach s,$(STUDENT),--student $(s)) $(if $(WORKERS),--workers $(WORKERS),)
grade: $(VENV)/.dev-installed
	$(BIN)/python $(COURSE)/course.py grade $(GRADE_ARGS)

# After grading written answers by hand: feedback and CSVs again, without re-running the grader.
report: $(VENV)/.dev-installed
	$(BIN)/python $(COURSE)/course.py report $(A) $(foreach s,$(STUDENT),--student $(s))

# After grading: the pairs of submissions worth reading side by side, per assignment.
similarity: $(VENV)/.dev-installed
	@test -n "$(A)" || { echo "make similarity needs A=, e.g. make similarity A=A4" >&2; exit 2; }
	$(BIN)/python $(COURSE)/similarity.py $(A)

# The grade CSV for Canvas (Grades > Import): ROSTER= Canvas's gradebook export, IDS="A1=123 A4=456".
canvas: $(VENV)/.dev-installed
	$(BIN)/python $(COURSE)/canvas.py $(if $(ROSTER),--roster $(ROSTER)) $(foreach i,$(IDS),--id $(i))

# Self-study, no teacher needed: `make assignment A=A1` copies A1's released notebook (no
# solutions, no hidden tests: leak-checked) into $(WORK)/A1/; `make check A=A1` grades it with
# the course's autograder and writes $(WORK)/A1/feedback.html (OPEN=1 opens it). The private
# course it grades in is cached in $(VENV)/self-study/; see notebooks/assignments/self_study.py.
# Self-study needs nbgrader only, not the test toolchain (transformers, triton, playwright, hub).
WORK ?= $(HOME)/attention-by-hand-work
$(VENV)/.grader-installed: requirements-dev.txt $(VENV)/.lab-installed
	$(INSTALL) -q "$$(grep -E '^nbgrader==' requirements-dev.txt)"
	@$(PIP) uninstall -y -q rfc3987-syntax 2>/dev/null || true  # see .lab-installed: 1-2 s per process
	@$(MAKE) -s nbgrader-ui TEACHER=0
	@touch $@

assignment: $(VENV)/.grader-installed
	@$(EDITION_ENV)$(BIN)/python $(COURSE)/self_study.py start $(A) --work "$(WORK)" $(EDITION_ARGS)

check: $(VENV)/.grader-installed
	@$(BIN)/python $(COURSE)/self_study.py check $(A) --work "$(WORK)" $(if $(filter 1,$(OPEN)),--open,)

demo: $(VENV)/.lab-installed
	$(BIN)/python -m mha

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis $(SITE) $(ZH_NOTEBOOKS)
