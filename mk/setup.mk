# External components Amber needs, installed by scripts/setup/*.sh into a cache
# outside the source tree (keyed by pinned version, so re-running is fast).
# Included by the top-level Makefile. Most targets need root.
#
#   make setup        what `amber` needs to run: runsc, criu (+ sysctl),
#                     the minimal and python templates
#   make setup-test   setup + PostgreSQL and MinIO for the store tests,
#                     kubeconform for the Kubernetes manifests (deploy/),
#                     the TypeScript SDK's npm dev dependencies, the official
#                     MCP clients (TypeScript SDK, Inspector), Redocly's CLI
#                     (the OpenAPI lint), Debian's
#                     chromium for the console's browser tests
#   make setup-extended  the chromium and postgres templates of
#                     `make test-extended`
#   make setup-<x>    one component
#
# A MinIO server for tests: scripts/setup/minio-start.sh DIR PORT (prints PID).

SHELL := /bin/bash
AMBER_CACHE ?= /var/cache/amber
export AMBER_CACHE

SETUP_SCRIPTS := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))../scripts/setup)

# Do not become the including Makefile's default goal (restored at the end).
_setup_mk_default_goal := $(.DEFAULT_GOAL)

.PHONY: setup setup-test setup-runsc setup-criu setup-sysctl setup-minimal \
	setup-python-template setup-postgres setup-minio setup-build-deps setup-test-deps setup-bench-deps setup-tssdk-deps setup-mcp-deps setup-e2b-deps setup-openapi-lint-deps setup-oapi-client-deps \
	setup-browser-deps setup-extended setup-chromium-template setup-postgres-template setup-kubeconform

setup: setup-build-deps setup-runsc setup-criu setup-sysctl setup-minimal setup-python-template

setup-test: setup setup-postgres setup-minio setup-test-deps setup-tssdk-deps setup-mcp-deps setup-e2b-deps setup-openapi-lint-deps setup-oapi-client-deps setup-browser-deps setup-kubeconform

setup-kubeconform:
	$(SETUP_SCRIPTS)/kubeconform.sh

setup-test-deps:
	$(SETUP_SCRIPTS)/test-deps.sh

# runc for `make bench-restore` (the raw runtime beside the criu driver).
setup-bench-deps:
	$(SETUP_SCRIPTS)/bench-deps.sh

# npm ci of sdk/typescript's dev dependencies into $(AMBER_CACHE)/npm (its tests).
setup-tssdk-deps:
	$(SETUP_SCRIPTS)/tssdk-deps.sh

# npm ci of the official MCP clients (TypeScript SDK, Inspector) into
# $(AMBER_CACHE)/npm (cmd/amber TestE2EMCPClients).
# npm ci of the official E2B SDK (e2b@2.51.0, tests/e2b) into $(AMBER_CACHE)/npm (TestE2EE2B).
setup-e2b-deps:
	$(SETUP_SCRIPTS)/e2b-deps.sh

setup-mcp-deps:
	$(SETUP_SCRIPTS)/npm-deps.sh mcp cmd/amber/testdata/mcpclients \
	  @modelcontextprotocol/sdk/package.json @modelcontextprotocol/inspector/package.json

# npm ci of Redocly's CLI into $(AMBER_CACHE)/npm (api TestOpenAPILint).
setup-openapi-lint-deps:
	$(SETUP_SCRIPTS)/npm-deps.sh openapi-lint api/lint @redocly/cli/bin/cli.js

# npm ci of openapi-fetch, openapi-typescript and tsc into $(AMBER_CACHE)/npm
# (cmd/amber TestE2EOpenAPIClient: a client generated from api/openapi.json).
setup-oapi-client-deps:
	$(SETUP_SCRIPTS)/npm-deps.sh oapi-client cmd/amber/testdata/oapiclient \
	  openapi-fetch/package.json openapi-typescript/bin/cli.js typescript/bin/tsc

# Debian's chromium for the console's browser tests (cmd/amber TestE2EConsole).
setup-browser-deps:
	$(SETUP_SCRIPTS)/browser-deps.sh

setup-extended: setup-chromium-template setup-postgres-template

setup-build-deps:
	$(SETUP_SCRIPTS)/build-deps.sh

setup-runsc:
	$(SETUP_SCRIPTS)/runsc.sh

setup-criu:
	$(SETUP_SCRIPTS)/criu.sh

setup-sysctl:
	$(SETUP_SCRIPTS)/sysctl.sh

setup-minimal:
	$(SETUP_SCRIPTS)/busybox.sh

setup-python-template:
	$(SETUP_SCRIPTS)/python-template.sh

setup-chromium-template:
	$(SETUP_SCRIPTS)/chromium-template.sh

setup-postgres-template:
	$(SETUP_SCRIPTS)/postgres-template.sh

setup-postgres:
	$(SETUP_SCRIPTS)/postgres.sh

setup-minio:
	$(SETUP_SCRIPTS)/minio.sh

.DEFAULT_GOAL := $(_setup_mk_default_goal)
