# Sourced by the scripts that install Debian packages (and embedded ahead of
# provision-k8s.sh by `leasehold dev`): one quiet `apt_install`.
#
# apt_install PKG...  installs what is missing, printing one line; apt's and dpkg's
# output goes to a log shown only on failure. No service a package ships is started:
# a policy-rc.d denies starts during the install (etcd-server would otherwise start a
# system etcd on 2379), and on a systemd machine such services are disabled and stopped
# after it (and the script says so).
apt_install() {
  local sudo="" missing=() p log rc=0
  [ "$(id -u)" = 0 ] || sudo=sudo
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  printf '[apt] installing %s\n' "${missing[*]}" >&2
  log=$(mktemp /tmp/leasehold-apt.XXXXXX)
  local policy=/usr/sbin/policy-rc.d had_policy=""
  [ -e "$policy" ] && had_policy=1
  [ -n "$had_policy" ] || printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  [ -n "$had_policy" ] || $sudo chmod 0755 "$policy"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
      -o Dpkg::Progress-Fancy=0 -o Dpkg::Use-Pty=0 --no-install-recommends "${missing[@]}"; } >"$log" 2>&1 || rc=$?
  [ -n "$had_policy" ] || $sudo rm -f "$policy"
  if [ $rc -ne 0 ]; then
    cat "$log" >&2; rm -f "$log"
    printf '[apt] installing %s failed (exit %s)\n' "${missing[*]}" "$rc" >&2
    return $rc
  fi
  rm -f "$log"
  if [ -d /run/systemd/system ]; then
    local unit
    for unit in etcd containerd docker; do
      if systemctl is-enabled --quiet "$unit" 2>/dev/null || systemctl is-active --quiet "$unit" 2>/dev/null; then
        printf '[apt] disabling and stopping the %s service the package enabled (leasehold runs its own)\n' "$unit" >&2
        $sudo systemctl disable --now --quiet "$unit" >&2 || true
      fi
    done
  fi
}
