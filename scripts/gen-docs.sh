#!/usr/bin/env bash
# Generates shell completions and the man page from the clap definitions into target/docs/.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet
out=${1:-target/docs}
./target/debug/dirseal generate-docs "$out"
ls "$out"
