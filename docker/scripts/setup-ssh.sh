#!/usr/bin/env bash
# SSH for multi-host jobs (the leader's mpirun starts ranks on the other hosts through ssh), key-only:
# - host keys are generated here, at build time, so every container of this image has the same host keys;
# - root gets a key pair whose public key is its own authorized key, so every container of this image trusts
#   every other container of the same image (and nothing else: no password matches root's);
# - known_hosts pins this image's host keys for any host name, so ssh between hosts needs no prompt and no
#   StrictHostKeyChecking=no.
# The launcher writes its own sshd_config at run time; the drop-in below only hardens the packaged defaults
# for anyone starting sshd by hand. Anyone holding the image holds the private key: run jobs on a private
# network (as SageMaker does), or bake your own keys.
set -euo pipefail

install -d -m 0755 /run/sshd
rm -f /etc/ssh/ssh_host_*
ssh-keygen -A
install -d -m 0700 /root/.ssh
ssh-keygen -q -t ed25519 -N '' -C "root@smhvd-image" -f /root/.ssh/id_ed25519
install -m 0600 /root/.ssh/id_ed25519.pub /root/.ssh/authorized_keys
for pub in /etc/ssh/ssh_host_*_key.pub; do
  printf '* %s\n' "$(cut -d ' ' -f 1,2 "$pub")"
done >/root/.ssh/known_hosts
chmod 0600 /root/.ssh/known_hosts
# No password can match '*'. Not 'passwd -l' ('!'): sshd without PAM (the launcher's config) refuses every
# login, keys included, to a locked account.
usermod -p '*' root
cat >/etc/ssh/sshd_config.d/smhvd.conf <<'CONF'
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UseDNS no
CONF
