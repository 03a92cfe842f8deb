#!/usr/bin/env bash
# Shell completions and man pages, as build.rs writes them from the clap definition
# (src/cli/args.rs) when it builds dirseal: copied from TARGET/debug/dirseal-docs into OUT
# (default target/docs/).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet -p dirseal-cli --bin dirseal
out=${1:-target/docs}
mkdir -p "$out"
cp -r "${CARGO_TARGET_DIR:-target}/debug/dirseal-docs/." "$out"
ls "$out"
