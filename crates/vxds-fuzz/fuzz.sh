#!/usr/bin/env bash
# Builds the fuzz targets (cargo fuzz, libFuzzer) and runs them; docs/fuzzing.md explains.
#
#   crates/vxds-fuzz/fuzz.sh build                     build every target
#   crates/vxds-fuzz/fuzz.sh smoke [SECONDS]           each target for SECONDS (default 30) on
#                                                      the committed corpus; what it finds new
#                                                      goes to a temporary folder (CI runs this)
#   crates/vxds-fuzz/fuzz.sh run SECONDS [TARGET...]   a campaign: each target for SECONDS,
#                                                      growing work/TARGET, findings in
#                                                      artifacts/TARGET
#
# The fuzzers run under `nice -n 19`, so that any build on the machine comes first. Builds go
# through `vcargo` (the machine-wide cargo lock) where it exists; the runs never hold it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

TARGETS=(xdstp_name constraint_text changeset_body admin_path)
# Stable Rust: no sanitizer (AddressSanitizer needs the nightly-only -Zsanitizer, and the
# crates forbid unsafe code), but debug assertions and overflow checks on.
BUILD_FLAGS=(--fuzz-dir crates/vxds-fuzz --sanitizer none --debug-assertions)
BIN_DIR="$here/target/x86_64-unknown-linux-gnu/release"
CARGO_FUZZ_VERSION=0.13.2

cargo_cmd() {
  if command -v vcargo >/dev/null 2>&1; then vcargo "$@"; else cargo "$@"; fi
}

ensure_cargo_fuzz() {
  if cargo fuzz --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"; then
    return
  fi
  echo "installing cargo-fuzz $CARGO_FUZZ_VERSION" >&2
  cargo_cmd install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
}

build() {
  ensure_cargo_fuzz
  # The fuzz crate's own lockfile pins what it builds: refuse to go on if it is stale, as
  # --locked does for the workspace (cargo fuzz build passes no such flag on).
  cargo_cmd metadata --locked --format-version 1 --manifest-path "$here/Cargo.toml" >/dev/null
  cargo_cmd fuzz build "${BUILD_FLAGS[@]}"
}

# Per target: the longest input libFuzzer makes. xdstp names go past MAX_NAME_LEN (8192).
max_len() {
  case "$1" in
    xdstp_name) echo 10000 ;;
    changeset_body) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

# run_target TARGET SECONDS WORK_DIR: new inputs go to WORK_DIR; the committed corpus and
# seeds are read only.
run_target() {
  local target=$1 seconds=$2 work=$3
  mkdir -p "$work" "$here/artifacts/$target"
  echo "== $target: ${seconds}s" >&2
  nice -n 19 "$BIN_DIR/$target" \
    -max_total_time="$seconds" \
    -max_len="$(max_len "$target")" \
    -timeout=10 \
    -rss_limit_mb=2048 \
    -dict="$here/dict/$target.dict" \
    -artifact_prefix="$here/artifacts/$target/" \
    -print_final_stats=1 \
    "$work" "$here/corpus/$target" "$here/seeds/$target"
}

case "${1:-}" in
  build)
    build
    ;;
  smoke)
    seconds=${2:-30}
    build
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    for target in "${TARGETS[@]}"; do
      run_target "$target" "$seconds" "$scratch/$target"
    done
    # A crash stops the script above (set -e), with libFuzzer's report and the input saved.
    echo "fuzz smoke: ${#TARGETS[@]} passed, 0 failed"
    ;;
  run)
    seconds=${2:?seconds per target}
    shift 2
    targets=("$@")
    [[ ${#targets[@]} -gt 0 ]] || targets=("${TARGETS[@]}")
    for target in "${targets[@]}"; do
      run_target "$target" "$seconds" "$here/work/$target"
    done
    ;;
  *)
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac
