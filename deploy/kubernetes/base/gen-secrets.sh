#!/bin/sh
# Writes the two credentials the base's secretGenerator turns into Secrets, unless they exist:
# secrets/token (the cluster token: metad, sidecars, the CLI) and secrets/peer-token (the Raft
# peer credential: metad replicas only; it must differ from the token). 32 random bytes each,
# hex, mode 0600. Keep them: a new token locks every running daemon out of the others.
set -eu
cd "$(dirname "$0")/secrets"
umask 077
for f in token peer-token; do
  if [ ! -s "$f" ]; then
    od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$f"
    echo >> "$f"
    echo "wrote $(pwd)/$f"
  fi
done
