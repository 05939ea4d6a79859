#!/bin/sh
# A scripted agent for `cargo kopt optimize --agent cmd:PATH`: an engineer in the loop whose
# candidates are hand-written. It answers a request for kernel K with the proposal in
# `K.proposal.json` next to this script, or in `$KOPT_PROPOSALS` where that is set (the
# request arrives as JSON on stdin).
set -eu
dir=${KOPT_PROPOSALS:-$(dirname "$0")}
kernel=$(sed -n 's/.*# Kernel `\([A-Za-z0-9_]*\)`.*/\1/p' | head -n 1)
file="$dir/$kernel.proposal.json"
if [ ! -f "$file" ]; then
    echo "no hand-written proposal for \`$kernel\` in $dir" >&2
    exit 3
fi
python3 -c 'import json, sys; print(json.dumps({"text": open(sys.argv[1]).read()}))' "$file"
