#!/usr/bin/env bash
# The README's first command: configures (preset `default`: Release, CUDA when nvcc is found),
# builds the library and the examples, and runs the main demo build/examples/hello_kvc.
# Arguments are passed to the demo.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

demo=build/examples/hello_kvc
cmake --preset default
cmake --build --preset default
if [[ ! -x "${demo}" ]]; then
  echo "scripts/demo.sh: no demo yet: ${demo} was not built (examples/hello_kvc.cpp is missing)." >&2
  echo "scripts/demo.sh: the library and the other examples built fine; nothing to run." >&2
  exit 0
fi
echo "+ ${demo} $*"
exec "${demo}" "$@"
