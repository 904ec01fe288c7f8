#!/bin/sh
# Create or rotate the webhook's TLS material, using only the gpu-admission CLI.
#   certs.sh bootstrap   the Job gpu-admission-certs (install; re-created by later `kubectl apply -k`)
#   certs.sh rotate      the CronJob gpu-admission-certs-rotate (twice a day)
#
#   no Secret yet        -> bootstrap: certs init, then certs secret (create), then certs inject
#                           rotate: stop with an error (only the bootstrap Job creates a CA, so two runs
#                           can never race to create two different CAs)
#   Secret with CA key   -> certs rotate (changes nothing unless something is due), then certs inject,
#                           then certs secret: the API server trusts a new CA before any pod serves a
#                           certificate signed by it (during a CA rollover ca-bundle.crt holds old + new)
#   Secret without CA key (managed elsewhere, e.g. cert-manager) -> stop, change nothing
#
# The Secret keeps ca.key and ca-bundle.crt next to tls.crt/tls.key/ca.crt so that a later run can rotate;
# the server's volume projects only tls.crt, tls.key and ca.crt.
#
# Every step is idempotent, so running it again (Job re-created on `kubectl apply`, CronJob) is harmless.
# Subcommands and flags this relies on: docs/deploy.md, "CLI requirements".
set -eu

MODE="${1:-}"
case "$MODE" in
  bootstrap | rotate) ;;
  *) echo "usage: certs.sh bootstrap|rotate" >&2; exit 2 ;;
esac

NAMESPACE="${GPU_ADMISSION_NAMESPACE:-gpu-admission}"
SERVICE="${GPU_ADMISSION_SERVICE:-gpu-admission}"
SECRET="${GPU_ADMISSION_SECRET:-gpu-admission-tls}"
WEBHOOK="${GPU_ADMISSION_WEBHOOK:-gpu-admission}"
DIR="${GPU_ADMISSION_CERTS_DIR:-/certs/material}"

log() { printf 'gpu-admission-certs: %s\n' "$*"; }

umask 077
mkdir -p "$DIR"
# Start from the cluster's state only. The emptyDir outlives a failed attempt (restartPolicy: OnFailure
# restarts the container in the same pod), and `certs fetch` refuses to overwrite what it finds.
for f in ca.crt ca.key tls.crt tls.key ca-bundle.crt; do
  rm -f "$DIR/$f"
done

# Read back what the cluster has. A missing Secret is not an error (--missing-ok); anything else
# (forbidden, API server unreachable, a Secret that is not a usable kubernetes.io/tls pair) is, and stops
# here before anything is generated.
gpu-admission certs fetch --name "$SECRET" --namespace "$NAMESPACE" --out "$DIR" --missing-ok

present=0
for f in ca.crt ca.key tls.crt tls.key ca-bundle.crt; do
  if [ -s "$DIR/$f" ]; then present=$((present + 1)); fi
done

if [ "$present" -eq 0 ] && [ "$MODE" = rotate ]; then
  log "no material in Secret $NAMESPACE/$SECRET: nothing to rotate; run the bootstrap Job again:" >&2
  log "kubectl -n $NAMESPACE delete job gpu-admission-certs --ignore-not-found; kubectl apply -k deploy/" >&2
  exit 1
elif [ "$present" -eq 0 ]; then
  log "no material in Secret $NAMESPACE/$SECRET: creating a CA and a serving certificate"
  gpu-admission certs init --service "$SERVICE" --namespace "$NAMESPACE" --out "$DIR"
  # Secret before caBundle: the server cannot serve before the Secret exists anyway, and a failed inject
  # is retried by the Job (the next attempt finds the Secret and injects its bundle).
  gpu-admission certs secret --dir "$DIR" --name "$SECRET" --namespace "$NAMESPACE" --include-ca
  gpu-admission certs inject --ca-bundle "$DIR/ca-bundle.crt" --webhook-name "$WEBHOOK"
elif [ -s "$DIR/ca.key" ] && [ -s "$DIR/ca.crt" ] && [ -s "$DIR/tls.crt" ] && [ -s "$DIR/tls.key" ]; then
  log "found Secret $NAMESPACE/$SECRET: rotating what is due"
  gpu-admission certs rotate --dir "$DIR"
  gpu-admission certs inject --ca-bundle "$DIR/ca-bundle.crt" --webhook-name "$WEBHOOK"
  gpu-admission certs secret --dir "$DIR" --name "$SECRET" --namespace "$NAMESPACE" --include-ca
else
  log "Secret $NAMESPACE/$SECRET exists without the CA key (managed elsewhere?); changing nothing." >&2
  log "Delete it to let this job create a new CA, or use the cert-manager overlay." >&2
  exit 1
fi
log "done"
