#!/usr/bin/env bash
# Run a command (pip, apt-get download...) that also trusts the CA certificates given as PEM text in the build
# argument EXTRA_CA_CERTS: needed behind an HTTPS-intercepting (corporate) proxy. The certificates live in a
# temporary bundle for this one command: the image's trust store is left unchanged. Empty: run the command as is.
set -euo pipefail

if [ -z "${EXTRA_CA_CERTS:-}" ]; then
  exec "$@"
fi
if ! grep -q -- '-----BEGIN CERTIFICATE-----' <<<"$EXTRA_CA_CERTS"; then
  echo "with-extra-ca: build argument EXTRA_CA_CERTS holds no PEM certificate (expected '-----BEGIN CERTIFICATE-----' blocks)" >&2
  exit 2
fi
bundle=$(mktemp --suffix=.pem)
trap 'rm -f "$bundle"' EXIT
cat /etc/ssl/certs/ca-certificates.crt >"$bundle"
printf '%s\n' "$EXTRA_CA_CERTS" >>"$bundle"
export PIP_CERT="$bundle" SSL_CERT_FILE="$bundle" REQUESTS_CA_BUNDLE="$bundle" CURL_CA_BUNDLE="$bundle"
"$@"
