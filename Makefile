# repdegen: one entry point per job. Run from the repository root.
PYTHON ?= python
# the console script of the active environment (pip install . or make install puts it there)
REPDEGEN ?= repdegen
# The torch build to install when none is present. On GPU machines the PyPI wheel of this version
# brings CUDA; on the CPU-only machines of this project it resolves to a local CPU build.
TORCH_SPEC ?= torch==2.13.0
TABLE ?= inan2017_t1
SCALE ?= smoke
ARGS ?=
# Corpora come from the Hugging Face hub, or from a local folder named by the environment variable REPDEGEN_DATA_DIR
# (README, section "Data"); the variable passes through make to every command.

.PHONY: install test test-fast test-slow test-gpu reproduce-table lint describe help sweep sweep-gamma sweep-alpha aggregate rerender report status

help:
	@echo "make install                               install repdegen (editable) and its dependencies"
	@echo "make test                                  the test suite, both tiers, two workers (what CI runs)"
	@echo "make test-fast                             the fast tier: no end-to-end tests (while cells train)"
	@echo "make test-slow                             real-corpus tests (PTB/WikiText-2 from REPDEGEN_DATA_DIR)"
	@echo "make reproduce-table TABLE=... SCALE=...   regenerate a paper table (smoke | lite | paper)"
	@echo "make lint                                  ruff"
	@echo "make sweep NAME=<conf/sweep preset> [SCALE= VALUES= SEEDS= EXPERIMENT= ARGS=]   a sweep, then aggregate"
	@echo "make sweep-gamma [SCALE= VALUES= SEEDS= EXPERIMENT= ARGS=]   CosReg gamma x seeds (Gao 2019), then aggregate"
	@echo "make sweep-alpha [OBJECTIVE=agg|al SCALE= VALUES= SEEDS= ...]  AGG alpha (Yu 2022 Fig. 5) or AL alpha (Inan 2017)"
	@echo "make aggregate SWEEP_DIR=<multirun dir> [ARGS=--metrics ...]   table + plots of a finished sweep (docs/sweeps.md)"
	@echo "make report                                results/README.md: every table and figure under results/"
	@echo "make status [ARGS=\"--scale paper --all\"]    the ledger's runs training, stopped or failed: epoch, best, ETA"
	@echo "make rerender [SCALES=\"smoke lite\"]          render every table again from the ledger (no training), then report"

install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "$(TORCH_SPEC)"
	$(PYTHON) -m pip install -e ".[dev,hf]"

# pytest-xdist workers for `make test` / `make test-fast` (one per core on CI's 2 cores; TEST_WORKERS=0: one process)
TEST_WORKERS ?= 2
test:
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --durations=15

# the fast tier: everything but the end-to-end tests (subprocesses, training through the entry points)
test-fast:
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) -m "not slow and not gpu and not e2e"

test-slow:
	$(PYTHON) -m pytest -q -m slow

test-gpu:
	$(PYTHON) -m pytest -q -m gpu

# TABLE=all (every table) or a comma-separated list; cells run a process each on the local GPUs (reproduce/runs/launch.py)
reproduce-table:
	$(REPDEGEN) table table=$(TABLE) scale=$(SCALE) $(ARGS)

# Render every table again from the run ledger (no training; a committed rendering with more complete cells is kept),
# at each scale of SCALES, then write results/README.md from results/.
SCALES ?= smoke lite paper
rerender:
	for s in $(SCALES); do $(REPDEGEN) table table=all scale=$$s render_only=true progress=false $(ARGS) || exit $$?; done
	$(REPDEGEN) report

# results/README.md from the files under results/ (reads what was rendered; composes nothing)
report:
	$(REPDEGEN) report $(ARGS)

status:
	$(REPDEGEN) status $(ARGS)

lint:
	$(PYTHON) -m ruff check .

# Sweeps (docs/sweeps.md): a Hydra multirun over the preset's values x seeds (conf/sweep/<name>.yaml), aggregated
# into the sweep folder (a generated table: table.md/.csv/.tex, cells.json, one PNG per metric) by the preset's callback, or here when a job
# failed. Empty VALUES / SEEDS / EXPERIMENT = the preset's; SWEEP_DIR = outputs/multirun/<name>-<scale>/<date_time>.
# AGG at smoke/lite: the 6-layer LM on WikiText-2 BPE, the stand-in its preset chooses (conf/experiment_scale/).
# make sweep NAME=<preset of conf/sweep/> [SCALE= VALUES= SEEDS= EXPERIMENT= SWEEP_DIR= ARGS=]: VALUES goes to the
# preset's swept key (its hydra.sweeper.params other than seed); sweep-gamma and sweep-alpha are two names of it.
sweep:
	@test -f "conf/sweep/$(NAME).yaml" || { echo "make sweep: NAME=$(NAME) is not a preset of conf/sweep/; expected one of:" \
	  $$(ls conf/sweep | sed 's/\.yaml$$//') "(e.g. make sweep NAME=agg_alpha)" >&2; exit 2; }
	key=$$($(PYTHON) -c "import yaml; p = yaml.safe_load(open('conf/sweep/$(NAME).yaml'))['hydra']['sweeper']['params']; print(next(k for k in p if k != 'seed'))"); \
	d="$(or $(SWEEP_DIR),outputs/multirun/$(NAME)-$(SCALE)/$$(date +%Y-%m-%d_%H-%M-%S))"; \
	$(REPDEGEN) train -m +sweep=$(NAME) scale=$(SCALE) $(if $(VALUES),"$$key=$(VALUES)") \
	  $(if $(SEEDS),seed=$(SEEDS)) $(if $(EXPERIMENT),experiment=$(EXPERIMENT)) "hydra.sweep.dir=$$d" $(ARGS) \
	|| { rc=$$?; $(REPDEGEN) aggregate "$$d"; exit $$rc; }

sweep-gamma:
	@$(MAKE) --no-print-directory sweep NAME=cosreg_gamma

sweep-alpha:
	@$(MAKE) --no-print-directory sweep NAME=$(or $(OBJECTIVE),agg)_alpha

aggregate:
	@test -n "$(SWEEP_DIR)" || { echo "make aggregate: SWEEP_DIR is empty; expected the folder of a multirun, e.g." \
	  "make aggregate SWEEP_DIR=outputs/multirun/agg_alpha-smoke/2026-01-31_12-00-00" >&2; exit 2; }
	$(REPDEGEN) aggregate $(SWEEP_DIR) $(ARGS)
