#!/usr/bin/env bash
# Build the "postgres" sandbox template (extended tests, fidelity item 6b):
# Debian bookworm with Debian's PostgreSQL server and psql client. No cluster
# is created in the template (deb-template.sh turns create_main_cluster off);
# a sandbox runs initdb into its own writable layer.
# Output and cache key: see deb-template.sh.
set -euo pipefail
REV=1 # bump when the smoke test or template.json below changes
exec "$(dirname "${BASH_SOURCE[0]}")/deb-template.sh" postgres "$REV" \
    postgresql,postgresql-client,procps \
    '/usr/lib/postgresql/15/bin/postgres --version && psql --version' \
    '{"env": ["PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8", "TERM=xterm"],
  "cwd": "/root", "user": "0:0",
  "limits": {"memory_bytes": 1073741824}}'
