#!/usr/bin/env bash
# deploy/systemd/packfeedd.service passes `systemd-analyze verify` (with
# ExecStart pointed at the built packfeedd, which verify requires to exist),
# keeps the settings operators rely on, and the check itself catches a broken
# unit. usage: systemd_unit_test.sh SOURCE_ROOT PACKFEEDD
set -euo pipefail
unit=$1/deploy/systemd/packfeedd.service packfeedd=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

sed "s|/usr/local/bin/packfeedd|$packfeedd|" "$unit" >"$work/packfeedd.service"
out=$(systemd-analyze verify "$work/packfeedd.service" 2>&1) || { echo "$out"; exit 1; }
[[ -z "$out" ]] || { echo "systemd-analyze verify warned: $out"; exit 1; }
echo "verify: clean"

for setting in Type=notify WatchdogSec= Restart=on-failure NoNewPrivileges=yes PrivateTmp=yes \
               ProtectSystem=strict ReadOnlyPaths= RuntimeDirectory=packfeed StandardOutput=journal; do
  grep -q "^$setting" "$unit" || { echo "missing: $setting"; exit 1; }
done
echo "settings: present"

sed 's/^Type=notify/Type=bogus/' "$work/packfeedd.service" >"$work/broken.service"
if systemd-analyze verify "$work/broken.service" >/dev/null 2>&1 &&
   [[ -z "$(systemd-analyze verify "$work/broken.service" 2>&1)" ]]; then
  echo "verify accepted Type=bogus: the check cannot fail"
  exit 1
fi
echo "a broken unit is caught"
