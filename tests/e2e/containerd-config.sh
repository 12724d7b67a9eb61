#!/usr/bin/env bash
# Write a node's containerd config: containerd's defaults with the pause image this
# repository builds (docker.io/library/pause:local), Debian's CNI plugins, CNI configs
# read from CNI_DIR, cgroupfs (no systemd here), and no OOM score adjustment (the
# sandbox may not lower scores). Shared by tests/e2e/real-node.sh and tests/e2e/cluster.sh.
#
# usage: tests/e2e/containerd-config.sh OUT.toml CNI_DIR
set -euo pipefail
containerd config default > "$1"
python3 - "$1" "$2" <<'PY'
import re, sys
p, cni = sys.argv[1], sys.argv[2]
s = open(p).read()
s = s.replace("restrict_oom_score_adj = false", "restrict_oom_score_adj = true")
s = re.sub(r'sandbox_image = ".*"', 'sandbox_image = "docker.io/library/pause:local"', s)
s = re.sub(r'bin_dir = ".*"', 'bin_dir = "/usr/lib/cni"', s)
s = re.sub(r'conf_dir = ".*"', f'conf_dir = "{cni}"', s)
s = s.replace("SystemdCgroup = true", "SystemdCgroup = false")
open(p, "w").write(s)
PY
