#!/usr/bin/env bash
# The demo command: installs the dependencies, builds the quickstart and trains the
# seeds' network on 8 local ranks with the seed's MatMul strategy ((2, 4), (4, 1)),
# then checks the losses against the same training on one rank. Extra arguments go
# to the quickstart (replacing --verify).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

build_dir=build
if [[ -f $build_dir/CMakeCache.txt ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build_dir/CMakeCache.txt"; then
  echo "demo.sh: $build_dir/ was configured with another generator; remove it and run again" >&2
  exit 1
fi

# Same configuration as scripts/test.sh, so that both share build/.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTESSERA_BUILD_TESTS=ON -DTESSERA_BUILD_BENCHMARKS=ON -DTESSERA_BUILD_EXAMPLES=ON
cmake --build "$build_dir" -j2 --target quickstart
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(--verify)
echo "demo.sh: mpiexec -n 8 --oversubscribe $build_dir/examples/quickstart ${args[*]}"
mpiexec -n 8 --oversubscribe "$build_dir/examples/quickstart" "${args[@]}"
