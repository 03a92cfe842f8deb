#!/usr/bin/env bash
# Process start and PAM module load time of two builds, measured in the same run (issue 29: the
# TPM and FIDO2 libraries only in the helpers). Runs `dirseal --version` and a pamtester
# authentication through a stack holding only pam_dirseal.so (optional) and pam_permit, N times
# each, the two builds alternating, and prints the mean per run and the ratio after/before.
#
#   sudo scripts/bench-start.sh BEFORE_DIR AFTER_DIR [N]
#
# Each DIR holds `dirseal` and `libpam_dirseal.so` (a target/<profile> directory, or a copy).
set -euo pipefail
# shellcheck disable=SC2034 # read by name: ${!b} below
before=${1:?BEFORE_DIR} after=${2:?AFTER_DIR} n=${3:-200}
[ "$(id -u)" = 0 ] || { echo "bench-start.sh: run as root (writes /etc/pam.d/dirseal-bench-*)" >&2; exit 1; }
command -v pamtester >/dev/null || { echo "bench-start.sh: needs pamtester" >&2; exit 1; }

svc=dirseal-bench-$$
trap 'rm -f /etc/pam.d/$svc-*' EXIT
printf 'auth required pam_permit.so\naccount required pam_permit.so\n' >"/etc/pam.d/$svc-none"
for b in before after; do
  dir=${!b}
  printf 'auth optional %s\nauth required pam_permit.so\naccount required pam_permit.so\n' \
    "$(realpath "$dir/libpam_dirseal.so")" >"/etc/pam.d/$svc-$b"
done

# Mean wall time of `$@` over $n runs, in microseconds.
mean_us() {
  local t0 t1
  t0=$(date +%s%N)
  for ((i = 0; i < n; i++)); do "$@" </dev/null >/dev/null 2>&1 || true; done
  t1=$(date +%s%N)
  echo $(((t1 - t0) / n / 1000))
}

declare -A sum=()
rounds=5
for ((r = 0; r < rounds; r++)); do
  for b in before after; do
    dir=${!b}
    sum[cli_$b]=$((${sum[cli_$b]:-0} + $(mean_us "$dir/dirseal" --version)))
    sum[pam_$b]=$((${sum[pam_$b]:-0} + $(mean_us pamtester "$svc-$b" root authenticate)))
  done
  sum[pam_none]=$((${sum[pam_none]:-0} + $(mean_us pamtester "$svc-none" root authenticate)))
done
for k in "${!sum[@]}"; do sum[$k]=$((sum[$k] / rounds)); done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
mod_before=$((sum[pam_before] - sum[pam_none])); mod_after=$((sum[pam_after] - sum[pam_none]))
echo "runs: $rounds rounds x $n, builds alternating"
printf '%-46s %10s %10s %8s\n' "" "before" "after" "ratio"
printf '%-46s %8d us %8d us %8s\n' "dirseal --version (process start)" "${sum[cli_before]}" "${sum[cli_after]}" \
  "$(ratio "${sum[cli_after]}" "${sum[cli_before]}")"
printf '%-46s %8d us %8d us %8s\n' "pamtester authenticate, module in the stack" "${sum[pam_before]}" "${sum[pam_after]}" \
  "$(ratio "${sum[pam_after]}" "${sum[pam_before]}")"
printf '%-46s %8d us %8d us %8s\n' "  of which the module (minus pam_permit only)" "$mod_before" "$mod_after" \
  "$(ratio "$mod_after" "$mod_before")"
printf '%-46s %8d us\n' "pamtester, pam_permit only" "${sum[pam_none]}"
