# Container images, built from their Dockerfiles without a Docker engine (buildah + podman from
# Debian packages: `bash scripts/install-system-deps.sh images`); included by the top-level Makefile.
#   make images                         build (or find cached) every image, print each one's size
#   make images IMAGE_NAMES=operator    only those (operator, worker-cpu, worker-slim)
#   make images IMAGES_FORCE=1          rebuild from scratch (no layer cache)
# An image whose inputs (Dockerfile, ignore file, context files, build args, base) are unchanged
# is not rebuilt; state lives under ~/.cache/ckpt-rollout/images/. See e2e/ckpt_e2e/images.py.
E2E_PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
IMAGE_NAMES ?=
IMAGES_FORCE ?=

.PHONY: images

images:
	PYTHONPATH=e2e $(E2E_PYTHON) -m ckpt_e2e.images build $(or $(IMAGE_NAMES),--all) $(if $(IMAGES_FORCE),--force)
