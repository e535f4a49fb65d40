#!/usr/bin/env bash
# The Debian packages the tests and `argus stack` run for real: Prometheus 2.42,
# Alertmanager 0.25 (binaries prometheus, promtool, prometheus-alertmanager, amtool) and
# VictoriaMetrics 1.79 (victoria-metrics, vmagent, vmalert: `argus stack --engine
# victoriametrics`).
# Idempotent: installs only what is missing (as root, or through sudo).
#
# Argus starts these binaries as plain processes with their own configs, data directories and
# ports, never as system services, so the packages' postinst must not start them either: a
# policy-rc.d that forbids starting services is put in place for the install and removed again
# if this script created it.
set -euo pipefail

if command -v promtool >/dev/null && command -v prometheus-alertmanager >/dev/null \
   && command -v vmalert >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "system-deps: install Prometheus (prometheus, promtool), Alertmanager" \
       "(prometheus-alertmanager, amtool) and VictoriaMetrics (victoria-metrics, vmagent," \
       "vmalert) with your package manager" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
policy=/usr/sbin/policy-rc.d
created=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod +x "$policy"
  created=1
fi
trap '[ -z "$created" ] || $sudo rm -f "$policy"' EXIT
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
  prometheus prometheus-alertmanager victoria-metrics
