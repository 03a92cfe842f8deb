#!/usr/bin/env bash
# mmdebstrap customize hook of scripts/system-test.sh: configures the guest's root filesystem ($1)
# on the host, with the kernel modules of the guest's kernel ($2, /lib/modules/VERSION of
# scripts/lib/guest.sh's kernel). Everything the test itself needs (users, dirseal) it sets up at
# run time.
set -euo pipefail
root=$1
mkdir -p "$root/usr/lib/modules"
cp -a "$2" "$root/usr/lib/modules/"
# mmdebstrap's --dpkgopt left out manuals and docs while building; the guest installs as usual.
rm -f "$root/etc/dpkg/dpkg.cfg.d/99mmdebstrap"
echo guest >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tguest\n' >"$root/etc/hosts"
cat >"$root/etc/fstab" <<'FSTAB'
/dev/vda / ext4 defaults 0 1
repo    /run/dirseal-repo    9p trans=virtio,version=9p2000.L,ro,msize=512000 0 0
bin     /run/dirseal-bin     9p trans=virtio,version=9p2000.L,ro,msize=512000 0 0
results /run/dirseal-results 9p trans=virtio,version=9p2000.L,msize=512000 0 0
FSTAB
# The test runs once the system is up, and powers it off when done (or when it fails to start).
cat >"$root/etc/systemd/system/dirseal-system-test.service" <<'UNIT'
[Unit]
Description=dirseal system test (scripts/system-test.sh)
After=multi-user.target
RequiresMountsFor=/run/dirseal-repo /run/dirseal-bin /run/dirseal-results
FailureAction=poweroff-force

[Service]
Type=oneshot
ExecStart=/bin/bash /run/dirseal-repo/scripts/system/guest.sh
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/dirseal-system-test.service "$root/etc/systemd/system/multi-user.target.wants/"
# The console login the test drives: agetty on the second serial port.
mkdir -p "$root/etc/systemd/system/getty.target.wants"
ln -sf /lib/systemd/system/serial-getty@.service "$root/etc/systemd/system/getty.target.wants/serial-getty@ttyS1.service"
# Nothing that runs on a timer or waits for a network the guest does not have.
for u in apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer \
         systemd-networkd-wait-online.service systemd-timesyncd.service getty@tty1.service \
         serial-getty@ttyS0.service systemd-journal-flush.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$u"
done
# Root logs in on the console of a debugging run (scripts/system-test.sh --cmd) without a password.
chroot "$root" passwd -d root >/dev/null
# The display manager (autologin scenario's image) starts when the scenario says, not at boot.
rm -f "$root/etc/systemd/system/display-manager.service"
