#!/usr/bin/env bash
# Make PostgreSQL's server binaries available for tests/test_pipeline_deployments.py (a Prefect server on
# PostgreSQL). Installs the Debian package when they are missing and apt-get can be used; otherwise says
# why and exits 0, and the test skips itself.
set -euo pipefail
if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[postgres] installing the postgresql package (for the PostgreSQL-backed Prefect server test)"
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null 2>&1
    }; then
        exit 0
    fi
fi
echo "[postgres] PostgreSQL is not installed and cannot be installed here; its test will be skipped"
