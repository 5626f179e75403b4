#!/usr/bin/env bash
# Runs eGPU's whole test suite: builds every crate (the test suites start the
# real binaries and shared libraries: egpud, egpu, libegpu.so, the simulated
# driver, the test workloads), runs clippy's deny-level lints, then every test.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> building the workspace (debug)"
cargo build --workspace --all-targets
# The whole-process tests start these binaries; tell them they are built.
export EGPU_TEST_PREBUILT=1

# The glibc 2.17 build of what runs in containers and on the host
# (tests/container.rs runs it in an old image).
if cargo zigbuild --help >/dev/null 2>&1 && { command -v zig >/dev/null 2>&1 || python3 -m ziglang version >/dev/null 2>&1; }; then
    echo "==> building libegpu.so and egpu-cdi-hook for glibc 2.17"
    ./scripts/build-compat.sh
else
    echo "==> cargo-zigbuild or zig is missing, so the glibc 2.17 build is not made: its container test runs the last one built, or says it is skipped (.ci/run installs both)"
fi

echo "==> clippy (deny-level lints such as undocumented unsafe blocks fail the run)"
cargo clippy --workspace --all-targets --quiet

if cargo nextest --version >/dev/null 2>&1; then
    echo "==> cargo nextest"
    cargo nextest run --workspace --no-fail-fast "$@"
else
    echo "==> cargo-nextest is not installed; falling back to cargo test (install it with: cargo install --locked cargo-nextest)"
    cargo test --workspace --no-fail-fast "$@"
fi

echo "==> doc tests"
cargo test --workspace --doc --quiet
