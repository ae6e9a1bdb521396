#!/usr/bin/env bash
# The test command: installs the dependencies, builds tessera with its tests and
# examples into build/ (the default build, which also checks that the benchmarks
# compile; `cmake --build build --target tessera_benchmarks` builds them), and runs the
# whole test suite with ctest.
# Extra arguments go to ctest (e.g. `scripts/test.sh -R core -L mpi`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

build_dir=build
if [[ -f $build_dir/CMakeCache.txt ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build_dir/CMakeCache.txt"; then
  echo "test.sh: $build_dir/ was configured with another generator; remove it and run again" >&2
  exit 1
fi

# Without a GPU the GPU tests skip, so their build only checks that they compile: their
# host code is compiled at -O0 there (TESSERA_GPU_TESTS_COMPILE_ONLY).
gpu_tests_compile_only=ON
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu_tests_compile_only=OFF
fi

echo "test.sh: configuring $build_dir/"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTESSERA_BUILD_TESTS=ON -DTESSERA_BUILD_BENCHMARKS=ON -DTESSERA_BUILD_EXAMPLES=ON \
  -DTESSERA_GPU_TESTS_COMPILE_ONLY=$gpu_tests_compile_only
echo "test.sh: building"
cmake --build "$build_dir" -j2
echo "test.sh: running the tests"
# Two tests at a time: the suite's MPI jobs spend much of their time starting up and
# waiting for each other (on a fresh 2-core machine the suite took 6.6-6.8 min this way,
# against 9.6 min one test at a time). `scripts/test.sh -j1` runs one at a time.
ctest --test-dir "$build_dir" --output-on-failure -j2 "$@"
