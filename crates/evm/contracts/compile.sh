#!/usr/bin/env bash
# Recompiles the contracts' checked-in bytecode (build/). Needs Node.js and the npm
# registry; the build and the tests do not run this.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm install --silent solc@0.8.28 >/dev/null)
node "$here/compile.js" "$work/node_modules/solc"
