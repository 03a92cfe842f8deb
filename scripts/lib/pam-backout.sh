# Backing dirseal out of PAM before its module goes: the one list of its pam-auth-update profiles
# and the check that no account is left without a way in. POSIX sh: scripts/install.sh --uninstall
# sources it, and scripts/build-deb.sh copies it into the package's prerm and postrm, so both
# removals do the same.
# shellcheck shell=sh

DIRSEAL_PAM_PROFILES="dirseal dirseal-pin dirseal-mkhome"

# The PIN-login accounts (docs/pam.md) that exist and have no password hash in /etc/shadow, one a
# line: `dirseal pin-login enable` names them in CONFIG's `[pam] pin_login = [...]` and replaces the
# hash with `*`. Only the `standalone` line of pam_dirseal logs them in; without the module they
# cannot log in at all. Read with awk: no TOML parser is around when the package is removed.
dirseal_pin_accounts() { # [CONFIG]
  _cfg=${1:-/etc/dirseal/config.toml}
  [ -r "$_cfg" ] || return 0
  awk '
    /^[ \t]*\[/ { section = $0; gsub(/[ \t]/, "", section); inlist = 0 }
    section == "[pam]" && /^[ \t]*pin_login[ \t]*=/ { inlist = 1; sub(/^[^=]*=/, "") }
    inlist {
      line = $0; sub(/#.*/, "", line)
      while (match(line, /"[^"]*"/)) { print substr(line, RSTART + 1, RLENGTH - 2); line = substr(line, RSTART + RLENGTH) }
      if ($0 ~ /\]/) inlist = 0
    }' "$_cfg" | while IFS= read -r _u; do
    getent passwd "$_u" >/dev/null 2>&1 || continue
    # A hash is what is left after the lock marks `!` and does not start with `*` (account.rs).
    _h=$(getent shadow "$_u" 2>/dev/null | cut -d: -f2 | sed 's/^!*//')
    case $_h in '' | '*'*) echo "$_u" ;; esac
  done
}

# Refuses (status 1, the reason on stderr) while PIN-login accounts would be locked out, else
# disables every dirseal profile. WHAT names the removal in the message.
dirseal_pam_backout() { # WHAT [CONFIG]
  _users=$(dirseal_pin_accounts "${2:-}")
  if [ -n "$_users" ]; then
    {
      echo "dirseal: not removing $1: these PIN-login accounts have no password and log in only through"
      echo "pam_dirseal, so they could not log in at all afterwards: $(echo "$_users" | paste -sd' ' -)."
      echo "Give each a password first, then remove again:"
      for _u in $_users; do echo "  dirseal pin-login disable $_u && passwd $_u"; done
    } >&2
    return 1
  fi
  if command -v pam-auth-update >/dev/null 2>&1; then
    # shellcheck disable=SC2086 # the list is words
    pam-auth-update --package --remove $DIRSEAL_PAM_PROFILES
  fi
}
