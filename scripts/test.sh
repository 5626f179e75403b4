#!/usr/bin/env bash
# Runs eGPU's whole test suite: builds every crate (the test suites start the
# real binaries and shared libraries: egpud, egpu, libegpu.so, the simulated
# driver, the test workloads), with clippy's lints, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

# Clippy lints eGPU's crates as they are built, not in a second pass: with
# clippy-driver as the workspace wrapper, `cargo build` runs every clippy lint
# on the workspace's crates (dependencies are compiled by plain rustc) and a
# deny-level lint, such as an undocumented unsafe block, fails the build. A
# separate `cargo clippy` re-checked every dependency and cost 4.5 minutes of
# a cold CI run (docs/benchmarks.md, "Build and CI time"). The wrapper is
# part of cargo's fingerprint, so nextest and the doc tests below run with it
# too and reuse this build; a later plain `cargo build` keeps its own copy.
CLIPPY_DRIVER="$(rustc --print sysroot)/bin/clippy-driver"
if [ -n "${RUSTC_WORKSPACE_WRAPPER:-}" ]; then
    echo "==> building the workspace (debug) with your RUSTC_WORKSPACE_WRAPPER=$RUSTC_WORKSPACE_WRAPPER; clippy's lints run only if that is clippy-driver"
elif [ -x "$CLIPPY_DRIVER" ]; then
    export RUSTC_WORKSPACE_WRAPPER="$CLIPPY_DRIVER"
    echo "==> building the workspace (debug), linted by clippy (deny-level lints fail the build)"
else
    echo "==> clippy is not installed (rustup component add clippy): building the workspace (debug) without its lints"
fi
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

if cargo nextest --version >/dev/null 2>&1; then
    echo "==> cargo nextest"
    cargo nextest run --workspace --no-fail-fast "$@"
else
    echo "==> cargo-nextest is not installed; falling back to cargo test (install it with: cargo install --locked cargo-nextest)"
    cargo test --workspace --no-fail-fast "$@"
fi

echo "==> doc tests"
cargo test --workspace --doc --quiet
